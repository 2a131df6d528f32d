//! The scripted model's answers in each API's own shape: Anthropic's Messages (JSON or
//! server-sent events), OpenAI's Responses (SSE) and Chat Completions (JSON or SSE).

use super::{Body, CACHED_TOKENS, INPUT_TOKENS, OUTPUT_TOKENS, Script, json_response};
use bytes::Bytes;
use http_body_util::{StreamBody, combinators::BoxBody};
use hyper::{Response, body::Frame};
use serde_json::{Value, json};
use std::{convert::Infallible, time::Duration};

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
