//! A command's way to the LLM gateway: reachable from inside the sandbox only while the
//! command runs, each connection announced with the sandbox's id ahead of its bytes.

mod common;

use common::{exec_req, fixture};
use std::sync::{Arc, Mutex};
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
