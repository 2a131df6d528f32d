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
use http_body_util::{BodyExt, Full, StreamBody, combinators::BoxBody};
use hyper::{Request, Response, body::Frame};
use serde_json::{Value, json};
use std::{
    convert::Infallible,
    sync::{Arc, Mutex},
    time::Duration,
};

mod followup;
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

fn sse_response(events: Vec<(String, Value)>, gap: Duration) -> Response<Body> {
    let stream = event_stream(events, gap);
    Response::builder()
        .status(200)
        .header("content-type", "text/event-stream")
        .header("cache-control", "no-cache")
        .body(BoxBody::new(StreamBody::new(stream)))
        .unwrap()
}

/// The events as SSE frames, `gap` apart.
fn event_stream(
    events: Vec<(String, Value)>,
    gap: Duration,
) -> tokio_stream::wrappers::ReceiverStream<Result<Frame<Bytes>, Infallible>> {
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    tokio::spawn(async move {
        for (event, data) in events {
            if !gap.is_zero() {
                tokio::time::sleep(gap).await;
            }
            let frame = format!("event: {event}\ndata: {data}\n\n");
            if tx.send(Ok(Frame::data(Bytes::from(frame)))).await.is_err() {
                return;
            }
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}

/// The tool results in a conversation, whichever of the three APIs it is in.
fn tool_results(body: &Value) -> usize {
    let none = Vec::new();
    let messages = body["messages"].as_array().unwrap_or(&none);
    let anthropic = messages
        .iter()
        .filter_map(|m| m["content"].as_array())
        .flatten()
        .filter(|b| b["type"] == "tool_result")
        .count();
    let responses = body["input"]
        .as_array()
        .unwrap_or(&none)
        .iter()
        .filter(|i| {
            matches!(
                i["type"].as_str(),
                Some("function_call_output" | "custom_tool_call_output")
            )
        })
        .count();
    let chat = messages.iter().filter(|m| m["role"] == "tool").count();
    anthropic + responses + chat
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

pub(crate) fn anthropic(
    script: &Script,
    body: &Value,
    model: &str,
    call: bool,
    n: usize,
) -> Response<Body> {
    let usage = json!({"input_tokens": INPUT_TOKENS - CACHED_TOKENS, "output_tokens": OUTPUT_TOKENS,
        "cache_read_input_tokens": CACHED_TOKENS, "cache_creation_input_tokens": 0});
    let id = format!("msg_scripted_{n}");
    // The shell tool the request offers: Claude Code's `Bash`, or the built-in anthropic
    // driver's `bash`.
    let offered = |name: &str| {
        body["tools"]
            .as_array()
            .is_some_and(|ts| ts.iter().any(|t| t["name"] == name))
    };
    let shell = if !offered("Bash") && offered("bash") {
        "bash"
    } else {
        "Bash"
    };
    let (block, stop) = if call {
        (
            json!({"type": "tool_use", "id": format!("toolu_scripted_{n}"), "name": shell,
                   "input": {"command": script.command, "description": "scripted edit"}}),
            "tool_use",
        )
    } else {
        (json!({"type": "text", "text": "done"}), "end_turn")
    };
    if body["stream"] != Value::Bool(true) {
        return json_response(
            200,
            &json!({"id": id, "type": "message", "role": "assistant", "model": model,
                    "content": [block], "stop_reason": stop, "usage": usage}),
        );
    }
    anthropic_stream(script, &id, model, block, stop)
}

/// The same answer as Anthropic's Messages API streams it (server-sent events), with the
/// tool call's input in one delta.
fn anthropic_stream(
    script: &Script,
    id: &str,
    model: &str,
    block: Value,
    stop: &str,
) -> Response<Body> {
    let call = block["type"] == "tool_use";
    let start_usage = json!({"input_tokens": INPUT_TOKENS - CACHED_TOKENS, "output_tokens": 1,
        "cache_read_input_tokens": CACHED_TOKENS, "cache_creation_input_tokens": 0});
    let (start_block, delta) = if call {
        let mut b = block.clone();
        b["input"] = json!({});
        (
            b,
            json!({"type": "input_json_delta", "partial_json": block["input"].to_string()}),
        )
    } else {
        (
            json!({"type": "text", "text": ""}),
            json!({"type": "text_delta", "text": "done"}),
        )
    };
    let ev = |e: &str, d: Value| (e.to_owned(), d);
    sse_response(
        vec![
            ev(
                "message_start",
                json!({"type": "message_start", "message": {"id": id, "type": "message",
                "role": "assistant", "model": model, "content": [], "stop_reason": null, "usage": start_usage}}),
            ),
            ev(
                "content_block_start",
                json!({"type": "content_block_start", "index": 0, "content_block": start_block}),
            ),
            ev(
                "content_block_delta",
                json!({"type": "content_block_delta", "index": 0, "delta": delta}),
            ),
            ev(
                "content_block_stop",
                json!({"type": "content_block_stop", "index": 0}),
            ),
            ev(
                "message_delta",
                json!({"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": null},
                "usage": {"output_tokens": OUTPUT_TOKENS}}),
            ),
            ev("message_stop", json!({"type": "message_stop"})),
        ],
        script.event_gap,
    )
}

fn openai_usage_responses() -> Value {
    json!({"input_tokens": INPUT_TOKENS, "input_tokens_details": {"cached_tokens": CACHED_TOKENS},
           "output_tokens": OUTPUT_TOKENS, "output_tokens_details": {"reasoning_tokens": 0},
           "total_tokens": INPUT_TOKENS + OUTPUT_TOKENS})
}

pub(crate) fn responses(script: &Script, model: &str, call: bool, n: usize) -> Response<Body> {
    let rid = format!("resp_scripted_{n}");
    let item = if call {
        json!({"type": "function_call", "id": format!("fc_{n}"), "call_id": format!("call_{n}"),
               "name": "exec_command", "arguments": json!({"cmd": script.command}).to_string()})
    } else {
        json!({"type": "message", "id": format!("msg_{n}"), "role": "assistant",
               "content": [{"type": "output_text", "text": "done", "annotations": []}]})
    };
    let ev = |e: &str, d: Value| (e.to_owned(), d);
    sse_response(
        vec![
            ev(
                "response.created",
                json!({"type": "response.created",
                "response": {"id": rid, "model": model, "status": "in_progress"}}),
            ),
            ev(
                "response.output_item.done",
                json!({"type": "response.output_item.done", "output_index": 0, "item": item}),
            ),
            ev(
                "response.completed",
                json!({"type": "response.completed",
                "response": {"id": rid, "model": model, "status": "completed", "output": [item],
                             "usage": openai_usage_responses()}}),
            ),
        ],
        script.event_gap,
    )
}

pub(crate) fn chat(
    script: &Script,
    body: &Value,
    model: &str,
    call: bool,
    n: usize,
) -> Response<Body> {
    let usage = json!({"prompt_tokens": INPUT_TOKENS, "completion_tokens": OUTPUT_TOKENS,
        "prompt_tokens_details": {"cached_tokens": CACHED_TOKENS}});
    let message = if call {
        json!({"role": "assistant", "content": null, "tool_calls": [{"id": format!("call_{n}"), "type": "function",
            "function": {"name": "bash", "arguments": json!({"command": script.command}).to_string()}}]})
    } else {
        json!({"role": "assistant", "content": "done"})
    };
    let finish = if call { "tool_calls" } else { "stop" };
    if body["stream"] != Value::Bool(true) {
        return json_response(
            200,
            &json!({"id": format!("chatcmpl_{n}"), "object": "chat.completion", "model": model,
                    "choices": [{"index": 0, "message": message, "finish_reason": finish}], "usage": usage}),
        );
    }
    let include_usage = body["stream_options"]["include_usage"] == Value::Bool(true);
    let mut events = vec![(
        "message".to_owned(),
        json!({"id": format!("chatcmpl_{n}"), "object": "chat.completion.chunk", "model": model,
               "choices": [{"index": 0, "delta": message, "finish_reason": finish}]}),
    )];
    if include_usage {
        events.push((
            "message".to_owned(),
            json!({"id": format!("chatcmpl_{n}"), "object": "chat.completion.chunk", "model": model,
                   "choices": [], "usage": usage}),
        ));
    }
    sse_response(events, script.event_gap)
}
