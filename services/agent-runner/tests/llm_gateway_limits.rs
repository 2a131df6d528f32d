//! The LLM gateway's listener against connections that announce a sandbox and then send
//! nothing: past its cap a connection waits for a slot, and each idle one is closed once
//! its header timeout passes, so a sandbox (or anyone who reaches the port) cannot hold
//! the runner's descriptors.

use forkyard_agent_runner::{
    llm::{Endpoint, Secret, http::RetryPolicy},
    llm_gateway::{LlmGateway, serve_within},
    models::Models,
};
use forkyard_common::http_limits::Limits;
use std::{sync::Arc, time::Duration};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
};

/// What stops a broken server from hanging the test; every wait is for a condition.
const GUARD: Duration = Duration::from_secs(60);

/// A gateway within `limits` (its upstreams nowhere: no request here reaches one).
async fn gateway(limits: Limits) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let endpoint = |base: &str| Endpoint {
        base_url: base.into(),
        key: Secret::new("sk-test".into()),
        retry: RetryPolicy::default(),
    };
    let gw = Arc::new(LlmGateway::new(
        endpoint("http://127.0.0.1:9"),
        endpoint("http://127.0.0.1:9/v1"),
        Models::default(),
        format!("http://{addr}"),
    ));
    tokio::spawn(serve_within(
        gw,
        listener,
        None,
        limits,
        tokio_util::sync::CancellationToken::new(),
    ));
    addr
}

/// A connection as a provisioner's relay opens one for `sandbox`, then silent.
async fn relayed(addr: &str, sandbox: &str) -> TcpStream {
    let mut conn = TcpStream::connect(addr).await.unwrap();
    conn.write_all(&forkyard_common::proxy_header::encode(sandbox))
        .await
        .unwrap();
    conn
}

/// Whether the gateway ends `conn` (end of file, or a reset).
async fn closed_by_gateway(conn: &mut TcpStream) -> bool {
    let mut buf = [0u8; 512];
    let to_end = async {
        loop {
            match conn.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    };
    tokio::time::timeout(GUARD, to_end).await.is_ok()
}

/// The answer to a request for a path the gateway does not serve.
async fn not_found(mut conn: TcpStream) -> String {
    conn.write_all(b"GET /nothing HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut out = String::new();
    let _ = tokio::time::timeout(GUARD, conn.read_to_string(&mut out)).await;
    out
}

#[tokio::test]
async fn a_connection_that_sends_no_request_is_closed_past_the_header_timeout() {
    let addr = gateway(Limits {
        max_connections: 8,
        header_timeout: Duration::from_millis(300),
        idle_timeout: GUARD,
    })
    .await;
    let mut silent: Vec<TcpStream> = Vec::new();
    for i in 0..20 {
        silent.push(relayed(&addr, &format!("sbx-{i}")).await);
    }
    for (i, conn) in silent.iter_mut().enumerate() {
        assert!(closed_by_gateway(conn).await, "connection {i} kept open");
    }
    let answer = not_found(relayed(&addr, "sbx-after").await).await;
    assert!(answer.starts_with("HTTP/1.1 404"), "{answer}");
}

#[tokio::test]
async fn past_the_cap_a_connection_waits_for_one_to_go() {
    let addr = gateway(Limits {
        max_connections: 2,
        header_timeout: GUARD,
        idle_timeout: GUARD,
    })
    .await;
    let first = relayed(&addr, "sbx-1").await;
    let _second = relayed(&addr, "sbx-2").await;
    let third = tokio::spawn({
        let addr = addr.clone();
        async move { not_found(relayed(&addr, "sbx-3").await).await }
    });
    // Not answered while the two hold the slots (at once without a cap).
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!third.is_finished(), "a connection past the cap was served");
    drop(first);
    let answer = third.await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 404"), "{answer}");
}

/// A kept-alive connection that goes quiet after its answer is closed once no byte has
/// moved for the idle timeout, long before the header timeout (a minute) would close it.
#[tokio::test]
async fn a_quiet_connection_is_closed_past_the_idle_timeout() {
    let addr = gateway(Limits {
        max_connections: 8,
        header_timeout: GUARD,
        idle_timeout: Duration::from_millis(300),
    })
    .await;
    let mut conn = relayed(&addr, "sbx-1").await;
    conn.write_all(b"GET /nothing HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut answer = Vec::new();
    let ended = tokio::time::timeout(GUARD / 4, async {
        let mut buf = [0u8; 4096];
        loop {
            match conn.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => answer.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    assert!(ended.is_ok(), "the quiet connection was held");
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 404"), "{answer}");
}
