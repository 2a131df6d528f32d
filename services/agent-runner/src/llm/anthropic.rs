//! The Anthropic Messages API (`POST /v1/messages`) with tool use.

use super::{
    Endpoint, LlmError, SYSTEM_PROMPT, ToolCall, ToolOutput, ToolSpec, Turn,
    http::{Chat, post_json},
};
use forkyard_proto::common::v1::Usage;
use reqwest::header::{HeaderMap, HeaderValue};
use serde_json::{Value, json};

pub const DEFAULT_BASE_URL: &str = "https://api.anthropic.com";
pub const KEY_VAR: &str = "ANTHROPIC_API_KEY";
pub const BASE_URL_VAR: &str = "ANTHROPIC_BASE_URL";
const VERSION: &str = "2023-06-01";
const MAX_TOKENS: u32 = 8192;

pub struct Anthropic {
    client: reqwest::Client,
    endpoint: Endpoint,
    model: String,
    tools: Value,
    pub(super) messages: Vec<Value>,
}

fn u64_at(v: &Value, key: &str) -> u64 {
    v.get(key).and_then(Value::as_u64).unwrap_or(0)
}

impl Anthropic {
    pub fn new(
        client: reqwest::Client,
        endpoint: Endpoint,
        model: String,
        tools: &[ToolSpec],
        prompt: &str,
    ) -> Self {
        let tools = tools
            .iter()
            .map(
                |t| json!({"name": t.name, "description": t.description, "input_schema": t.schema}),
            )
            .collect();
        Self {
            client,
            endpoint,
            model,
            tools: Value::Array(tools),
            messages: vec![json!({"role": "user", "content": prompt})],
        }
    }

    fn headers(&self) -> HeaderMap {
        let mut h = HeaderMap::new();
        if let Some(key) = &self.endpoint.key
            && let Ok(mut v) = HeaderValue::from_str(key.expose())
        {
            v.set_sensitive(true);
            h.insert("x-api-key", v);
        }
        h.insert("anthropic-version", HeaderValue::from_static(VERSION));
        h
    }

    pub async fn next_turn(&mut self) -> Result<Turn, LlmError> {
        let body = json!({
            "model": self.model,
            "max_tokens": MAX_TOKENS,
            "system": SYSTEM_PROMPT,
            "tools": self.tools,
            "messages": self.messages,
        });
        let url = format!(
            "{}/v1/messages",
            self.endpoint.base_url.trim_end_matches('/')
        );
        let resp = post_json(
            &self.client,
            &url,
            self.headers(),
            &body,
            self.endpoint.retry,
            self.endpoint.key.as_ref(),
            Chat {
                provider: "anthropic",
                model: &self.model,
                usage: |v| crate::usage::claude_usage(&v["usage"]),
            },
        )
        .await?;
        let (turn, content) = read_turn(&resp)?;
        // The assistant message goes back verbatim: tool_use blocks must precede their
        // tool_result blocks in the next request.
        self.messages
            .push(json!({"role": "assistant", "content": content}));
        Ok(turn)
    }

    pub fn add_tool_outputs(&mut self, outputs: &[ToolOutput]) {
        let blocks: Vec<Value> = outputs
            .iter()
            .map(|o| {
                json!({
                    "type": "tool_result",
                    "tool_use_id": o.call.id,
                    "content": o.content,
                    "is_error": o.is_error,
                })
            })
            .collect();
        self.messages
            .push(json!({"role": "user", "content": blocks}));
    }
}

/// A Messages API answer as a turn (its text, tool calls, stop reason and usage), and
/// its content blocks as they came.
fn read_turn(resp: &Value) -> Result<(Turn, Value), LlmError> {
    let content = resp
        .get("content")
        .and_then(Value::as_array)
        .ok_or_else(|| LlmError::Protocol("message without a content array".into()))?;
    let mut turn = Turn {
        stop_reason: resp
            .get("stop_reason")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned(),
        ..Default::default()
    };
    for block in content {
        match block.get("type").and_then(Value::as_str) {
            Some("text") => {
                turn.text
                    .push_str(block.get("text").and_then(Value::as_str).unwrap_or(""));
            }
            Some("tool_use") => turn.calls.push(ToolCall {
                id: block
                    .get("id")
                    .and_then(Value::as_str)
                    .ok_or_else(|| LlmError::Protocol("tool_use without an id".into()))?
                    .to_owned(),
                name: block
                    .get("name")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned(),
                input: block.get("input").cloned().unwrap_or(json!({})),
            }),
            _ => {}
        }
    }
    let u = resp.get("usage").cloned().unwrap_or(Value::Null);
    turn.usage = Usage {
        input_tokens: u64_at(&u, "input_tokens"),
        output_tokens: u64_at(&u, "output_tokens"),
        cache_read_tokens: u64_at(&u, "cache_read_input_tokens"),
        cache_write_tokens: u64_at(&u, "cache_creation_input_tokens"),
    };
    Ok((turn, Value::Array(content.clone())))
}
