//! The metering LLM gateway on its own: a real gateway listener, a real ledger, a local
//! model server. Connections arrive as a provisioner's relay sends them (a PROXY v2
//! header naming the sandbox, then HTTP/1.1).

mod common;

use axum::{
    Router,
    response::sse::{Event, Sse},
    routing::post,
};
use common::{KEY, Shared, a_usage, fixture, model_server};
use forkyard_agent_runner::{
    charge::Charger,
    llm::{Endpoint, Secret, http::RetryPolicy},
    llm_gateway::{
        LlmGateway,
        grants::{Allowed, GrantSpec, Stop},
    },
    models::Models,
};
use forkyard_proto::budget::v1::budget_ledger_client::BudgetLedgerClient;
use serde_json::{Value, json};
use std::{collections::BTreeSet, sync::Arc, time::Duration};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
};

fn endpoint(base: &str) -> Endpoint {
    Endpoint {
        base_url: base.into(),
        key: Secret::new(KEY.into()),
        retry: RetryPolicy::default(),
    }
}

/// A gateway in front of `anthropic_base`; its address.
async fn gateway(anthropic_base: &str) -> (Arc<LlmGateway>, String) {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let gw = Arc::new(LlmGateway::new(
        endpoint(anthropic_base),
        endpoint(&format!("{anthropic_base}/v1")),
        Models::default(),
        format!("http://{addr}"),
    ));
    tokio::spawn(forkyard_agent_runner::llm_gateway::serve(
        gw.clone(),
        l,
        None,
        tokio_util::sync::CancellationToken::new(),
    ));
    (gw, addr)
}

/// One request as a relay from `sandbox` delivers it: (status, body).
async fn call(addr: &str, sandbox: Option<&str>, token: &str, body: &Value) -> (u16, String) {
    exchange(addr, sandbox, token, body, None).await
}

/// [`call`], and once the response's body holds `gate.0`, `gate.1` is opened (the model
/// server waits on it before it sends the rest).
async fn exchange(
    addr: &str,
    sandbox: Option<&str>,
    token: &str,
    body: &Value,
    mut gate: Option<(&str, &tokio::sync::Notify)>,
) -> (u16, String) {
    let mut conn = TcpStream::connect(addr).await.unwrap();
    if let Some(s) = sandbox {
        conn.write_all(&forkyard_common::proxy_header::encode(s))
            .await
            .unwrap();
    }
    let body = body.to_string();
    let req = format!(
        "POST /v1/messages HTTP/1.1\r\nhost: 127.0.0.1\r\nx-api-key: {token}\r\nanthropic-version: 2023-06-01\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = conn.write_all(req.as_bytes()).await;
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match conn.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                out.extend_from_slice(&buf[..n]);
                if let Some((marker, open)) = gate
                    && let Some(head_end) = out.windows(4).position(|w| w == b"\r\n\r\n")
                    && String::from_utf8_lossy(&out[head_end..]).contains(marker)
                {
                    open.notify_one();
                    gate = None;
                }
            }
        }
    }
    let text = String::from_utf8_lossy(&out).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_owned();
    (status, body)
}

fn message(model: &str, input: u64, output: u64) -> Value {
    json!({"id": "msg_1", "type": "message", "role": "assistant", "model": model,
           "content": [{"type": "text", "text": "ok"}], "stop_reason": "end_turn",
           "usage": a_usage(input, output)})
}

fn ask(model: &str) -> Value {
    json!({"model": model, "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]})
}

fn refused(reason: &str) -> u64 {
    forkyard_common::metrics::registry()
        .gather()
        .iter()
        .filter(|f| f.name() == "llm_gateway_refused_total")
        .flat_map(|f| f.get_metric())
        .filter(|m| m.get_label().iter().any(|l| l.value() == reason))
        .map(|m| m.get_counter().get_value() as u64)
        .sum()
}

/// A token for fork 1 of run-1, in sandbox `sbx-a`, charging nothing.
fn mint(
    gw: &LlmGateway,
    allowed: Allowed,
) -> forkyard_agent_runner::llm_gateway::grants::GrantHandle {
    gw.grants.mint(GrantSpec {
        snapshotter: None,
        sandbox_id: "sbx-a".into(),
        run_id: "run-1".into(),
        fork: 1,
        allowed,
        charger: None,
        ledger_grace: Duration::from_secs(120),
        remote: false,
    })
}

fn only(model: &str) -> Allowed {
    Allowed::Only(BTreeSet::from([model.to_owned()]))
}

#[tokio::test]
async fn a_token_works_only_from_its_own_sandbox_and_only_while_its_command_runs() {
    let script: Shared = Arc::default();
    for _ in 0..2 {
        script
            .lock()
            .unwrap()
            .replies
            .push_back((200, message("claude-haiku-4-5", 10, 2)));
    }
    let base = model_server(script.clone()).await;
    let (gw, addr) = gateway(&base).await;
    let grant = mint(&gw, Allowed::Any);
    let token = grant.token().to_owned();

    let (status, body) = call(&addr, Some("sbx-a"), &token, &ask("claude-haiku-4-5")).await;
    assert_eq!(status, 200, "{body}");
    {
        let s = script.lock().unwrap();
        let (headers, _) = &s.requests[0];
        assert_eq!(headers["x-api-key"], KEY, "the real key upstream");
        assert!(
            headers
                .iter()
                .all(|(_, v)| !v.to_str().unwrap_or_default().contains(&token))
        );
    }

    // Another sandbox presenting it: refused, counted, and the model never asked.
    let (status, body) = call(&addr, Some("sbx-b"), &token, &ask("claude-haiku-4-5")).await;
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("another sandbox"), "{body}");
    assert_eq!(refused("wrong_sandbox"), 1);
    // No sandbox header at all (not from a relay): the connection is dropped.
    let (status, _) = call(&addr, None, &token, &ask("claude-haiku-4-5")).await;
    assert_eq!(status, 0);
    assert_eq!(refused("no_proxy_header"), 1);
    // The command ended (its sandbox destroyed): the token is dead.
    drop(grant);
    let (status, body) = call(&addr, Some("sbx-a"), &token, &ask("claude-haiku-4-5")).await;
    assert_eq!(status, 401, "{body}");
    assert_eq!(json_type(&body), "authentication_error");
    assert_eq!(refused("unknown_token"), 1);
    assert_eq!(script.lock().unwrap().requests.len(), 1);
}

fn json_type(body: &str) -> String {
    serde_json::from_str::<Value>(body).unwrap_or_default()["error"]["type"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

#[tokio::test]
async fn a_model_outside_the_runs_list_is_refused_before_reaching_the_model() {
    let script: Shared = Arc::default();
    let base = model_server(script.clone()).await;
    let (gw, addr) = gateway(&base).await;
    let grant = mint(&gw, only("claude-haiku-4-5"));
    let (status, body) = call(&addr, Some("sbx-a"), grant.token(), &ask("claude-opus-4-1")).await;
    assert_eq!(status, 403, "{body}");
    assert!(
        body.contains("claude-opus-4-1") && body.contains("claude-haiku-4-5"),
        "{body}"
    );
    assert_eq!(refused("model"), 1);
    assert!(script.lock().unwrap().requests.is_empty());
}

#[tokio::test]
async fn an_unreachable_model_api_is_a_502_the_agent_sees_and_costs_nothing() {
    // A port with nothing behind it.
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().to_string()
    };
    let (gw, addr) = gateway(&format!("http://{dead}")).await;
    let grant = mint(&gw, Allowed::Any);
    let (status, body) = call(
        &addr,
        Some("sbx-a"),
        grant.token(),
        &ask("claude-haiku-4-5"),
    )
    .await;
    assert_eq!(status, 502, "{body}");
    assert_eq!(json_type(&body), "api_error");
    assert!(!body.contains(KEY));
    let t = grant.settle(Duration::from_secs(5)).await;
    assert_eq!((t.requests, t.cost_micros), (0, 0));
}

/// Fork 1's charges to `reservation_id` of `run`, through `ledger`.
fn charger(
    ledger: forkyard_common::balance::Balanced,
    reservation_id: String,
    run: &str,
) -> Charger {
    Charger {
        client: BudgetLedgerClient::new(forkyard_common::grpc_telemetry::traced_channel(ledger)),
        reservation_id,
        key_prefix: format!("{run}/fork-1/a1"),
        run_id: run.into(),
        fork: 1,
        model: String::new(),
        activity_attempt: 1,
    }
}

#[tokio::test]
async fn each_answer_is_charged_once_and_a_spent_reservation_refuses_the_next_request() {
    let script: Shared = Arc::default();
    for _ in 0..3 {
        // claude-haiku-4-5 at $1 / $5 per million: 1000 in + 1000 out = 6000 micro-USD.
        script
            .lock()
            .unwrap()
            .replies
            .push_back((200, message("claude-haiku-4-5", 1000, 1000)));
    }
    let base = model_server(script.clone()).await;
    let mut f = fixture(&base).await;
    let reservation_id = f.reservation("run-g", 10_000, 10_000).await;
    let (gw, addr) = gateway(&base).await;
    let grant = gw.grants.mint(GrantSpec {
        snapshotter: None,
        sandbox_id: "sbx-a".into(),
        run_id: "run-g".into(),
        fork: 1,
        allowed: Allowed::Any,
        charger: Some(charger(f.runner.ledger.clone(), reservation_id, "run-g")),
        ledger_grace: Duration::from_secs(120),
        remote: false,
    });
    let token = grant.token().to_owned();
    let (status, _) = call(&addr, Some("sbx-a"), &token, &ask("claude-haiku-4-5")).await;
    assert_eq!(status, 200);
    grant.settle(Duration::from_secs(5)).await;
    assert_eq!(f.charged("run-g").await, 6000);
    // The second answer is delivered, but its charge does not fit: the fork is spent.
    let (status, _) = call(&addr, Some("sbx-a"), &token, &ask("claude-haiku-4-5")).await;
    assert_eq!(status, 200);
    let why = tokio::time::timeout(Duration::from_secs(10), grant.stopped())
        .await
        .expect("the refusal reaches the driver");
    assert!(matches!(why, Stop::Spent(w) if !w.is_empty()));
    let (status, body) = call(&addr, Some("sbx-a"), &token, &ask("claude-haiku-4-5")).await;
    assert_eq!(status, 402, "{body}");
    assert_eq!(json_type(&body), "billing_error");
    assert_eq!(refused("budget"), 1);
    assert_eq!(
        script.lock().unwrap().requests.len(),
        2,
        "the third never reached the model"
    );
    let t = grant.settle(Duration::from_secs(5)).await;
    assert_eq!(
        (t.requests, t.cost_micros, t.charged_micros),
        (2, 12_000, 6000)
    );
    assert_eq!(
        f.charged("run-g").await,
        6000,
        "posted once, the refused one not at all"
    );
}

/// The gateway passes a stream on as the model makes it, not once it is whole: the model
/// sends its first event and then waits until the client has received it before it
/// sends the rest, so a gateway that held the stream back never gets the rest. (How
/// soon the first byte arrives is `make bench-llm-gateway`'s figure.)
#[tokio::test]
async fn a_stream_passes_through_as_it_is_made_and_its_usage_is_read() {
    use futures::StreamExt;
    let gate = Arc::new(tokio::sync::Notify::new());
    let model_gate = gate.clone();
    let stream = move || {
        let gate = model_gate.clone();
        async move {
            let first = (
                "message_start",
                json!({"type": "message_start", "message": {"model": "claude-haiku-4-5", "usage": {"input_tokens": 100, "output_tokens": 1}}}),
            );
            let rest = vec![
                (
                    "content_block_delta",
                    json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "hi"}}),
                ),
                (
                    "message_delta",
                    json!({"type": "message_delta", "usage": {"output_tokens": 50}}),
                ),
                ("message_stop", json!({"type": "message_stop"})),
            ];
            let first = futures::stream::iter([first]);
            // The rest only once the client has the first event.
            let rest = futures::stream::once(async move {
                gate.notified().await;
                futures::stream::iter(rest)
            })
            .flatten();
            Sse::new(first.chain(rest).map(|(e, d)| {
                Ok::<_, std::convert::Infallible>(Event::default().event(e).data(d.to_string()))
            }))
        }
    };
    let app = Router::new().route("/v1/messages", post(stream));
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", l.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(l, app).await.unwrap() });
    let (gw, addr) = gateway(&base).await;
    let grant = mint(&gw, Allowed::Any);
    let mut body = ask("claude-haiku-4-5");
    body["stream"] = json!(true);
    let (status, text) = tokio::time::timeout(
        Duration::from_secs(30),
        exchange(
            &addr,
            Some("sbx-a"),
            grant.token(),
            &body,
            Some(("event: message_start", &gate)),
        ),
    )
    .await
    .expect("the first event never reached the client while the model held the rest back: the gateway buffered the stream");
    assert_eq!(status, 200);
    assert!(text.contains("message_stop"), "{text}");
    let t = grant.settle(Duration::from_secs(5)).await;
    assert_eq!(
        (t.requests, t.usage.input_tokens, t.usage.output_tokens),
        (1, 100, 50)
    );
    // claude-haiku-4-5: 100 × $1 + 50 × $5 per million.
    assert_eq!(t.cost_micros, 350);
}

#[tokio::test]
async fn answers_go_on_through_a_short_ledger_outage_and_stop_after_the_grace() {
    let script: Shared = Arc::default();
    for _ in 0..3 {
        script
            .lock()
            .unwrap()
            .replies
            .push_back((200, message("claude-haiku-4-5", 1000, 1000)));
    }
    let base = model_server(script.clone()).await;
    let mut f = fixture(&base).await;
    let reservation_id = f.reservation("run-away", 100_000, 100_000).await;
    // The ledger is gone once the reservation is made: every charge is refused connection.
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", l.local_addr().unwrap())
    };
    let ledger = forkyard_agent_runner::runner::short_call_channel("ledger", &closed).unwrap();
    let (gw, addr) = gateway(&base).await;
    let grant = gw.grants.mint(GrantSpec {
        snapshotter: None,
        sandbox_id: "sbx-a".into(),
        run_id: "run-away".into(),
        fork: 1,
        allowed: Allowed::Any,
        charger: Some(charger(ledger, reservation_id, "run-away")),
        ledger_grace: Duration::from_secs(1),
        remote: false,
    });
    let token = grant.token().to_owned();
    // Within the grace: answered, and counted though not charged.
    for _ in 0..2 {
        let (status, body) = call(&addr, Some("sbx-a"), &token, &ask("claude-haiku-4-5")).await;
        assert_eq!(status, 200, "{body}");
    }
    let why = tokio::time::timeout(Duration::from_secs(30), grant.stopped())
        .await
        .expect("the driver hears the agent must stop");
    assert!(
        matches!(&why, Stop::LedgerAway(w) if w.contains("ledger")),
        "{why:?}"
    );
    let (status, body) = call(&addr, Some("sbx-a"), &token, &ask("claude-haiku-4-5")).await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(
        script.lock().unwrap().requests.len(),
        2,
        "the third never reached the model"
    );
    let t = grant.settle(Duration::from_secs(5)).await;
    assert_eq!(
        (t.requests, t.cost_micros, t.charged_micros),
        (2, 12_000, 0),
        "what was used is known, for the fork's commit"
    );
}
