//! A command's way to the LLM gateway: reachable from inside the sandbox only while the
//! command runs, each connection announced with the sandbox's id ahead of its bytes.

mod common;

use common::{exec_req, fixture, fixture_with};
use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpListener,
};

/// A stand-in gateway: answers every request with the sandbox id its proxy header named
/// and the request line it got; records the ids.
async fn gateway() -> (String, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let record = seen.clone();
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            let record = record.clone();
            tokio::spawn(async move {
                let id = forkyard_common::proxy_header::read_sandbox_id(&mut conn)
                    .await
                    .unwrap_or_else(|e| format!("refused: {e}"));
                record.lock().unwrap().push(id.clone());
                let mut buf = vec![0u8; 4096];
                let n = conn.read(&mut buf).await.unwrap_or(0);
                let head = String::from_utf8_lossy(&buf[..n]);
                let line = head.lines().next().unwrap_or_default().to_owned();
                let body = format!("{id} {line}");
                let reply = format!(
                    "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = conn.write_all(reply.as_bytes()).await;
            });
        }
    });
    (url, seen)
}

#[tokio::test]
async fn the_llm_endpoint_relays_to_the_gateway_naming_the_sandbox_while_the_command_runs() {
    let f = fixture().await;
    let sbx = f.create().await;
    let (url, seen) = gateway().await;
    let mut req = exec_req(
        &sbx.id,
        &[
            "sh",
            "-c",
            "curl -sS --max-time 10 \"$FORKYARD_LLM_URL/v1/messages?x=1\"",
        ],
    );
    req.llm_gateway = url.clone();
    let out = f.core.exec(req).await.unwrap();
    assert_eq!(out.exit_code, 0, "{}", out.stderr);
    assert_eq!(
        out.stdout,
        format!("{} GET /v1/messages?x=1 HTTP/1.1", sbx.id)
    );
    assert_eq!(*seen.lock().unwrap(), std::slice::from_ref(&sbx.id));
    // The relay's socket went with the command.
    let dir = f.state.join("sandboxes").join(&sbx.id);
    let sockets: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("llm-"))
        .collect();
    assert!(sockets.is_empty(), "{sockets:?}");

    // A command without the field has no endpoint at all.
    let out = f
        .sh(
            &sbx.id,
            "echo \"url=$FORKYARD_LLM_URL\"; curl -sS --max-time 5 http://127.0.0.1:4000/ 2>&1; echo rc=$?",
        )
        .await;
    assert!(out.stdout.starts_with("url=\n"), "{}", out.stdout);
    assert!(!out.stdout.contains("rc=0"), "{}", out.stdout);
    assert_eq!(seen.lock().unwrap().len(), 1);
}

#[tokio::test]
async fn a_gateway_that_is_not_a_plain_host_port_url_is_invalid_argument() {
    let f = fixture().await;
    let sbx = f.create().await;
    for bad in ["https://x:1", "127.0.0.1:1", "http://h", "http://user@h:1"] {
        let mut req = exec_req(&sbx.id, &["true"]);
        req.llm_gateway = bad.into();
        let status = tonic::Status::from(f.core.exec(req).await.unwrap_err());
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{bad}");
        assert!(
            status.message().contains("llm_gateway"),
            "{}",
            status.message()
        );
    }
}

/// A stand-in gateway that holds every connection open without a byte until its client
/// goes: the most it held at once, and how many it got.
async fn silent_gateway() -> (String, Arc<AtomicUsize>, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (open, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let total = Arc::new(AtomicUsize::new(0));
    let (o, m, t) = (open.clone(), most.clone(), total.clone());
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            t.fetch_add(1, Ordering::SeqCst);
            m.fetch_max(o.fetch_add(1, Ordering::SeqCst) + 1, Ordering::SeqCst);
            let o = o.clone();
            tokio::spawn(async move {
                let mut buf = [0u8; 512];
                while matches!(conn.read(&mut buf).await, Ok(n) if n > 0) {}
                o.fetch_sub(1, Ordering::SeqCst);
            });
        }
    });
    (url, most, total)
}

/// A sandbox opening many connections to its LLM endpoint and sending nothing: the relay
/// holds at most its cap of them (each is two of the provisioner's descriptors), and
/// closes each one that stays idle, so every one of them ends.
#[tokio::test]
async fn a_sandbox_holds_at_most_its_relays_cap_and_idle_connections_are_closed() {
    let f = fixture_with(|_, c| {
        c.llm_relay = forkyard_sandbox_provisioner::local::RelayLimits {
            max_connections: 4,
            idle_timeout: Duration::from_millis(500),
        };
    })
    .await;
    let sbx = f.create().await;
    let (url, most, total) = silent_gateway().await;
    // 40 connections, then how many of them were ended by the other side.
    // Within two minutes in all: a bound on a broken relay, not a timing.
    let script = r#"import socket, time
conns = [socket.create_connection(("127.0.0.1", 4000)) for _ in range(40)]
deadline = time.monotonic() + 120
ended = 0
for c in conns:
    c.settimeout(max(0.01, deadline - time.monotonic()))
    try:
        ended += c.recv(1) == b""
    except socket.timeout:
        pass
    except OSError:
        ended += 1
print(ended)
"#;
    f.core
        .write_file(forkyard_proto::sandbox::v1::WriteFileRequest {
            sandbox_id: sbx.id.clone(),
            path: "flood.py".into(),
            content: script.as_bytes().to_vec(),
            mode: 0o644,
        })
        .await
        .unwrap();
    let mut req = exec_req(&sbx.id, &["python3", "flood.py"]);
    req.llm_gateway = url;
    req.timeout_secs = 600;
    let out = f.core.exec(req).await.unwrap();
    assert_eq!(out.exit_code, 0, "{}", out.stderr);
    assert_eq!(out.stdout.trim(), "40", "idle connections kept open");
    assert_eq!(total.load(Ordering::SeqCst), 40);
    let most = most.load(Ordering::SeqCst);
    assert!(
        most <= 4,
        "the gateway held {most} of the sandbox's connections at once"
    );
}
