//! The LLM gateway's public listener, for sandboxes off the mesh's hosts (E2B): no
//! PROXY header, the token alone names the fork, and only tokens minted for remote
//! sandboxes are taken there; a remote token is refused through a relay.

mod common;

use common::{KEY, Shared, a_usage, model_server};
use forkyard_agent_runner::{
    llm::{Endpoint, Secret, http::RetryPolicy},
    llm_gateway::{
        LlmGateway,
        grants::{Allowed, GrantHandle, GrantSpec},
    },
    models::Models,
};
use serde_json::{Value, json};
use std::{sync::Arc, time::Duration};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
};
use tokio_util::sync::CancellationToken;

fn endpoint(base: &str) -> Endpoint {
    Endpoint {
        base_url: base.into(),
        key: Secret::new(KEY.into()),
        retry: RetryPolicy::default(),
    }
}

/// A gateway in front of `base`, serving relayed and public connections: their
/// addresses.
async fn gateway(base: &str) -> (Arc<LlmGateway>, String, String) {
    let (relayed, public) = (
        TcpListener::bind("127.0.0.1:0").await.unwrap(),
        TcpListener::bind("127.0.0.1:0").await.unwrap(),
    );
    let (r, p) = (
        relayed.local_addr().unwrap().to_string(),
        public.local_addr().unwrap().to_string(),
    );
    let mut gw = LlmGateway::new(
        endpoint(base),
        endpoint(&format!("{base}/v1")),
        Models::default(),
        format!("http://{r}"),
    );
    gw.public_url = Some(format!("http://{p}"));
    let gw = Arc::new(gw);
    use forkyard_agent_runner::llm_gateway::{DEFAULT_LIMITS, serve, serve_public};
    tokio::spawn(serve(gw.clone(), relayed, None, CancellationToken::new()));
    tokio::spawn(serve_public(
        gw.clone(),
        public,
        DEFAULT_LIMITS,
        CancellationToken::new(),
    ));
    (gw, r, p)
}

fn mint(gw: &LlmGateway, sandbox: &str, remote: bool) -> GrantHandle {
    gw.grants.mint(GrantSpec {
        snapshotter: None,
        sandbox_id: sandbox.into(),
        run_id: "run-1".into(),
        fork: 1,
        allowed: Allowed::Any,
        charger: None,
        ledger_grace: Duration::from_secs(120),
        remote,
    })
}

/// One Messages request (through a relay from `sandbox`, or straight): its status and
/// body.
async fn call(addr: &str, sandbox: Option<&str>, token: &str) -> (u16, String) {
    let mut conn = TcpStream::connect(addr).await.unwrap();
    if let Some(s) = sandbox {
        let header = forkyard_common::proxy_header::encode(s);
        conn.write_all(&header).await.unwrap();
    }
    let body = json!({"model": "claude-haiku-4-5", "max_tokens": 8,
                      "messages": [{"role": "user", "content": "hi"}]})
    .to_string();
    let req = format!(
        "POST /v1/messages HTTP/1.1\r\nhost: x\r\nx-api-key: {token}\r\nanthropic-version: 2023-06-01\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    conn.write_all(req.as_bytes()).await.unwrap();
    let mut out = String::new();
    let _ = conn.read_to_string(&mut out).await;
    let status = out
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (
        status,
        out.split_once("\r\n\r\n").map_or("", |(_, b)| b).to_owned(),
    )
}

fn reply() -> (u16, Value) {
    (
        200,
        json!({"id": "msg_1", "type": "message", "role": "assistant",
               "model": "claude-haiku-4-5", "content": [{"type": "text", "text": "ok"}],
               "stop_reason": "end_turn", "usage": a_usage(10, 2)}),
    )
}

#[tokio::test]
async fn the_public_listener_takes_only_remote_sandboxes_tokens() {
    let script: Shared = Arc::default();
    script.lock().unwrap().replies.push_back(reply());
    let base = model_server(script.clone()).await;
    let (gw, relayed, public) = gateway(&base).await;
    let remote = mint(&gw, "e2b-abc", true);
    let local = mint(&gw, "sbx-a", false);

    let (status, body) = call(&public, None, remote.token()).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(remote.totals().requests, 1, "metered on the fork's grant");
    // A local sandbox's token straight to the public listener: refused, model not asked.
    let (status, body) = call(&public, None, local.token()).await;
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("not for the public endpoint"), "{body}");
    // A remote token through some sandbox's relay: another sandbox's token.
    let (status, body) = call(&relayed, Some("sbx-a"), remote.token()).await;
    assert_eq!(status, 403, "{body}");
    // Dead once its command ends, as every token.
    let token = remote.token().to_owned();
    drop(remote);
    let (status, _) = call(&public, None, &token).await;
    assert_eq!(status, 401);
    assert_eq!(script.lock().unwrap().requests.len(), 1);
}
