//! A scripted model server speaking the wire protocols the real agent CLIs use: the
//! Anthropic Messages API (`POST /v1/messages`, server-sent events or JSON, and
//! `/v1/messages/count_tokens`), the OpenAI Responses API (`POST /v1/responses`, SSE)
//! and Chat Completions (`POST /v1/chat/completions`). HTTP/1.1 with keep-alive, as the
//! vendors serve it. Every request is recorded with its headers.
//!
//! The script: until the conversation holds a tool result (or [`Script::calls`] of
//! them), the model asks for one shell command (Claude Code's `Bash` tool, Codex's
//! `exec_command`); then it answers "done".
//! With [`Script::never_stop`] it asks for a command on every turn, like a model that
//! would run up any bill. With [`Followup`]s (Messages and Responses), a conversation
//! whose last instruction is a follow-up's prompt gets the follow-up's command instead,
//! and only if the request carries the earlier turns: a tool result holding `earlier`.

use bytes::Bytes;
use http_body_util::{BodyExt, Full, combinators::BoxBody};
use hyper::{Request, Response};
use serde_json::{Value, json};
use std::{
    convert::Infallible,
    sync::{Arc, Mutex},
    time::Duration,
};

mod apis;
mod followup;
pub(crate) use apis::{anthropic, chat, responses};
pub use followup::Followup;

/// Usage every scripted response reports.
pub const INPUT_TOKENS: u64 = 1000;
pub const OUTPUT_TOKENS: u64 = 200;
/// Of the input, cached (read) tokens: Anthropic reports them apart, OpenAI inside.
pub const CACHED_TOKENS: u64 = 200;

#[derive(Debug, Clone)]
pub struct Recorded {
    pub method: String,
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: Value,
}

impl Recorded {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

#[derive(Debug, Clone)]
pub struct Script {
    /// The shell command the model asks to run.
    pub command: String,
    /// Ask for the command on every turn.
    pub never_stop: bool,
    /// Ask for the command until the conversation holds this many tool results (1 by
    /// default: one edit, then "done").
    pub calls: usize,
    /// Pause between streamed events (a slow model).
    pub event_gap: Duration,
    /// Pause before answering a model call, streamed or not (a slow model).
    pub delay: Duration,
    /// Answer this many model calls with 503 first (an API that is down).
    pub fail_first: usize,
    /// Later instructions in the conversation, each answered its own way.
    pub followups: Vec<Followup>,
}

impl Script {
    pub fn edit(command: &str) -> Self {
        Self {
            command: command.into(),
            never_stop: false,
            calls: 1,
            event_gap: Duration::ZERO,
            delay: Duration::ZERO,
            fail_first: 0,
            followups: Vec::new(),
        }
    }

    pub fn never_stop(command: &str) -> Self {
        Self {
            never_stop: true,
            ..Self::edit(command)
        }
    }
}

pub struct ScriptedModel {
    /// `http://127.0.0.1:<port>` (no `/v1`).
    pub url: String,
    pub requests: Arc<Mutex<Vec<Recorded>>>,
}

pub(crate) type Body = BoxBody<Bytes, Infallible>;

impl ScriptedModel {
    pub async fn start(script: Script) -> Self {
        Self::start_on("127.0.0.1:0", script).await.unwrap()
    }

    /// Listening on `addr` (`0.0.0.0:8080` for other hosts and containers to reach).
    pub async fn start_on(addr: &str, script: Script) -> std::io::Result<Self> {
        let listener = tokio::net::TcpListener::bind(addr).await?;
        let url = format!("http://{}", listener.local_addr()?);
        let requests: Arc<Mutex<Vec<Recorded>>> = Arc::default();
        let (rec, script) = (requests.clone(), Arc::new(script));
        tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                let (rec, script) = (rec.clone(), script.clone());
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |req| {
                        let (rec, script) = (rec.clone(), script.clone());
                        async move { Ok::<_, Infallible>(answer(&script, &rec, req).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(conn), svc)
                        .await;
                });
            }
        });
        Ok(Self { url, requests })
    }

    pub fn recorded(&self) -> Vec<Recorded> {
        self.requests.lock().unwrap().clone()
    }

    /// Requests that reached a model (not token counts or model lists).
    pub fn model_calls(&self) -> Vec<Recorded> {
        self.recorded()
            .into_iter()
            .filter(|r| {
                matches!(
                    r.path.as_str(),
                    "/v1/messages" | "/v1/responses" | "/v1/chat/completions"
                )
            })
            .collect()
    }
}

pub(crate) fn json_response(status: u16, v: &Value) -> Response<Body> {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(v.to_string())).boxed())
        .unwrap()
}

/// The tool results in a conversation, whichever of the three APIs it is in.
fn tool_results(body: &Value) -> usize {
    let items = body["messages"]
        .as_array()
        .or_else(|| body["input"].as_array());
    items.map_or(0, |ms| followup::tool_results(ms).len())
}

async fn answer(
    script: &Script,
    rec: &Mutex<Vec<Recorded>>,
    req: Request<hyper::body::Incoming>,
) -> Response<Body> {
    let (parts, body) = req.into_parts();
    let bytes = body
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    let path = parts.uri.path().to_owned();
    rec.lock().unwrap().push(Recorded {
        method: parts.method.to_string(),
        path: path.clone(),
        headers: parts
            .headers
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_str().unwrap_or_default().to_owned()))
            .collect(),
        body: body.clone(),
    });
    let model = body["model"].as_str().unwrap_or("unknown").to_owned();
    let call = script.never_stop || tool_results(&body) < script.calls.max(1);
    let n = rec.lock().unwrap().len();
    if n <= script.fail_first && path != "/v1/messages/count_tokens" {
        return json_response(
            503,
            &json!({"type": "error", "error": {"type": "overloaded_error", "message": "scripted outage"}}),
        );
    }
    let model_call = matches!(
        path.as_str(),
        "/v1/messages" | "/v1/responses" | "/v1/chat/completions"
    );
    if model_call && !script.delay.is_zero() {
        tokio::time::sleep(script.delay).await;
    }
    if model_call && let Some(answer) = followup::answer(script, &path, &body, &model, n) {
        return answer;
    }
    match path.as_str() {
        "/v1/messages/count_tokens" => json_response(200, &json!({"input_tokens": 10})),
        "/v1/messages" => anthropic(script, &body, &model, call, n),
        "/v1/responses" => responses(script, &model, call, n),
        "/v1/chat/completions" => chat(script, &body, &model, call, n),
        _ => json_response(404, &json!({"error": {"message": "not found"}})),
    }
}
