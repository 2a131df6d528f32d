//! OpenAI-compatible chat completions (`POST {base}/chat/completions`) with tool calls:
//! OpenAI itself, vLLM, Ollama and other servers speaking the same protocol.

use super::{
    Endpoint, LlmError, SYSTEM_PROMPT, ToolCall, ToolOutput, ToolSpec, Turn,
    http::{Chat, post_json},
};
use forkyard_proto::common::v1::Usage;
use reqwest::header::{AUTHORIZATION, HeaderMap, HeaderValue};
use serde_json::{Value, json};

pub const DEFAULT_BASE_URL: &str = "https://api.openai.com/v1";
pub const KEY_VAR: &str = "OPENAI_API_KEY";
pub const BASE_URL_VAR: &str = "OPENAI_BASE_URL";

pub struct OpenAi {
    client: reqwest::Client,
    endpoint: Endpoint,
    model: String,
    tools: Value,
    pub(super) messages: Vec<Value>,
}

fn u64_at(v: &Value, ptr: &str) -> u64 {
    v.pointer(ptr).and_then(Value::as_u64).unwrap_or(0)
}

impl OpenAi {
    pub fn new(
        client: reqwest::Client,
        endpoint: Endpoint,
        model: String,
        tools: &[ToolSpec],
        prompt: &str,
    ) -> Self {
        let tools = tools
            .iter()
            .map(|t| {
                json!({"type": "function", "function": {
                    "name": t.name, "description": t.description, "parameters": t.schema}})
            })
            .collect();
        Self {
            client,
            endpoint,
            model,
            tools: Value::Array(tools),
            messages: vec![
                json!({"role": "system", "content": SYSTEM_PROMPT}),
                json!({"role": "user", "content": prompt}),
            ],
        }
    }

    fn headers(&self) -> HeaderMap {
        let mut h = HeaderMap::new();
        // Local servers (Ollama, vLLM) usually take no key.
        if let Some(key) = &self.endpoint.key
            && let Ok(mut v) = HeaderValue::from_str(&format!("Bearer {}", key.expose()))
        {
            v.set_sensitive(true);
            h.insert(AUTHORIZATION, v);
        }
        h
    }

    pub async fn next_turn(&mut self) -> Result<Turn, LlmError> {
        let resp = self.complete().await?;
        let (turn, assistant) = parse_completion(&resp)?;
        self.messages.push(assistant);
        Ok(turn)
    }

    /// The model's completion of the conversation so far, with the tools offered.
    async fn complete(&self) -> Result<Value, LlmError> {
        let body = json!({
            "model": self.model,
            "messages": self.messages,
            "tools": self.tools,
            "tool_choice": "auto",
        });
        let url = format!(
            "{}/chat/completions",
            self.endpoint.base_url.trim_end_matches('/')
        );
        post_json(
            &self.client,
            &url,
            self.headers(),
            &body,
            self.endpoint.retry,
            self.endpoint.key.as_ref(),
            Chat {
                provider: "openai",
                model: &self.model,
                usage: |v| {
                    crate::usage::openai_usage(
                        &v["usage"],
                        "prompt_tokens",
                        "completion_tokens",
                        "prompt_tokens_details",
                    )
                },
            },
        )
        .await
    }

    pub fn add_tool_outputs(&mut self, outputs: &[ToolOutput]) {
        for o in outputs {
            self.messages.push(json!({
                "role": "tool",
                "tool_call_id": o.call.id,
                "content": o.content,
            }));
        }
    }
}

/// A completion's turn, and the assistant message it adds to the conversation.
fn parse_completion(resp: &Value) -> Result<(Turn, Value), LlmError> {
    let choice = resp
        .pointer("/choices/0")
        .ok_or_else(|| LlmError::Protocol("completion without choices".into()))?;
    let message = choice
        .get("message")
        .cloned()
        .ok_or_else(|| LlmError::Protocol("choice without a message".into()))?;
    let turn = Turn {
        stop_reason: choice
            .get("finish_reason")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned(),
        text: message
            .get("content")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned(),
        calls: tool_calls(&message)?,
        usage: usage(resp),
    };
    let mut assistant = json!({"role": "assistant", "content": message.get("content").cloned().unwrap_or(Value::Null)});
    if let Some(calls) = message
        .get("tool_calls")
        .filter(|c| c.as_array().is_some_and(|a| !a.is_empty()))
    {
        assistant["tool_calls"] = calls.clone();
    }
    Ok((turn, assistant))
}

/// The tool calls in an assistant `message`.
fn tool_calls(message: &Value) -> Result<Vec<ToolCall>, LlmError> {
    let mut calls = Vec::new();
    for call in message
        .get("tool_calls")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let args = call
            .pointer("/function/arguments")
            .and_then(Value::as_str)
            .unwrap_or("{}");
        calls.push(ToolCall {
            id: call
                .get("id")
                .and_then(Value::as_str)
                .ok_or_else(|| LlmError::Protocol("tool call without an id".into()))?
                .to_owned(),
            name: call
                .pointer("/function/name")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned(),
            // Models sometimes emit broken JSON; the tool then reports the problem
            // to the model instead of the run failing.
            input: serde_json::from_str(args).unwrap_or(Value::String(args.to_owned())),
        });
    }
    Ok(calls)
}

fn usage(resp: &Value) -> Usage {
    // prompt_tokens includes cached tokens; they are priced separately.
    let cached = u64_at(resp, "/usage/prompt_tokens_details/cached_tokens");
    Usage {
        input_tokens: u64_at(resp, "/usage/prompt_tokens").saturating_sub(cached),
        output_tokens: u64_at(resp, "/usage/completion_tokens"),
        cache_read_tokens: cached,
        cache_write_tokens: 0,
    }
}
