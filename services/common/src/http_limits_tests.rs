//! The bounds on real sockets: a server of [`serve`] on loopback, its clients plain TCP.

use super::{Idle, Limits, serve};
use std::{net::SocketAddr, time::Duration};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
};

const LONG: Duration = Duration::from_secs(60);

/// A server on loopback: `GET /` answers, `POST /` echoes its body.
async fn server(limits: Limits) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = axum::Router::new().route(
        "/",
        axum::routing::get(|| async { "ok" }).post(|body: String| async move { body }),
    );
    tokio::spawn(serve(listener, limits, app, std::future::pending()));
    addr
}

/// Whether the server closes `conn` (end of file or an error) before the guard's minute:
/// waits for the condition, the minute only stops a broken server from hanging the test.
async fn closed_by_server(conn: &mut TcpStream) -> bool {
    let mut buf = [0u8; 1024];
    let read_to_end = async {
        loop {
            match conn.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    };
    tokio::time::timeout(LONG, read_to_end).await.is_ok()
}

/// A full response to `GET /` on a new connection.
async fn get(addr: SocketAddr) -> String {
    let mut conn = TcpStream::connect(addr).await.unwrap();
    conn.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut out = String::new();
    tokio::time::timeout(LONG, conn.read_to_string(&mut out))
        .await
        .expect("an answer")
        .unwrap();
    out
}

#[tokio::test]
async fn connections_that_send_no_request_are_closed_past_the_header_timeout() {
    let addr = server(Limits {
        max_connections: 4,
        header_timeout: Duration::from_millis(200),
        idle_timeout: LONG,
    })
    .await;
    // More than the cap: the later ones are accepted as the first are closed.
    let mut idle = Vec::new();
    for _ in 0..10 {
        idle.push(TcpStream::connect(addr).await.unwrap());
    }
    // Half a request line, never finished.
    idle[0].write_all(b"GET / HT").await.unwrap();
    for (i, conn) in idle.iter_mut().enumerate() {
        assert!(closed_by_server(conn).await, "connection {i} kept open");
    }
    assert!(get(addr).await.starts_with("HTTP/1.1 200"));
}

#[tokio::test]
async fn at_the_cap_a_new_connection_waits_until_one_is_gone() {
    let addr = server(Limits {
        max_connections: 2,
        header_timeout: LONG,
        idle_timeout: LONG,
    })
    .await;
    let a = TcpStream::connect(addr).await.unwrap();
    let _b = TcpStream::connect(addr).await.unwrap();
    let third = tokio::spawn(get(addr));
    // Not served while the two hold the slots (served at once without a cap).
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!third.is_finished(), "a third connection was served");
    drop(a);
    let answer = third.await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
}

#[tokio::test]
async fn a_request_whose_body_stops_coming_is_closed_past_the_idle_timeout() {
    let addr = server(Limits {
        max_connections: 4,
        header_timeout: LONG,
        idle_timeout: Duration::from_millis(200),
    })
    .await;
    let mut conn = TcpStream::connect(addr).await.unwrap();
    conn.write_all(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nonly a part")
        .await
        .unwrap();
    assert!(closed_by_server(&mut conn).await);
}

#[tokio::test]
async fn bytes_that_keep_moving_keep_a_connection_open() {
    let (ours, mut theirs) = tokio::io::duplex(64);
    let mut idle = Idle::new(ours, Duration::from_millis(200));
    // A byte every 50 ms for a second: never 200 ms without one.
    let writer = tokio::spawn(async move {
        for _ in 0..20 {
            theirs.write_all(b"x").await.unwrap();
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        theirs
    });
    let mut got = [0u8; 20];
    idle.read_exact(&mut got).await.expect("no idle timeout");
    let _theirs = writer.await.unwrap();
    // Then nothing: timed out, with the error saying so.
    let err = idle.read(&mut [0u8; 1]).await.unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::TimedOut);
}
