//! Usage from model responses as they pass through: Anthropic Messages, OpenAI Chat
//! Completions and OpenAI Responses, each as one JSON body or as a server-sent event
//! stream. The bytes are only looked at, never changed or held back.

use crate::usage::{claude_usage, openai_usage};
use forkyard_proto::common::v1::Usage;
use serde_json::Value;

/// The APIs the gateway meters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    Messages,
    ChatCompletions,
    Responses,
}

/// A JSON body longer than this is not parsed for usage (no real response is).
const MAX_JSON_BODY: usize = 64 << 20;
/// An SSE line longer than this is skipped (usage events are short).
const MAX_LINE: usize = 8 << 20;

/// What one response used, read as it streams.
#[derive(Debug)]
pub struct Meter {
    api: Api,
    sse: bool,
    /// A JSON body so far, or the unfinished SSE line.
    buf: Vec<u8>,
    skipping_line: bool,
    pub usage: Usage,
    /// The model the response names (else the request's is used).
    pub model: Option<String>,
}

/// Each count the larger of the two: streamed counts are cumulative.
fn at_least(a: &mut Usage, b: &Usage) {
    a.input_tokens = a.input_tokens.max(b.input_tokens);
    a.output_tokens = a.output_tokens.max(b.output_tokens);
    a.cache_read_tokens = a.cache_read_tokens.max(b.cache_read_tokens);
    a.cache_write_tokens = a.cache_write_tokens.max(b.cache_write_tokens);
}

impl Meter {
    pub fn new(api: Api, content_type: &str) -> Self {
        Self {
            api,
            sse: content_type.starts_with("text/event-stream"),
            buf: Vec::new(),
            skipping_line: false,
            usage: Usage::default(),
            model: None,
        }
    }

    /// Look at the next piece of the body.
    pub fn feed(&mut self, chunk: &[u8]) {
        if !self.sse {
            if self.buf.len() + chunk.len() <= MAX_JSON_BODY {
                self.buf.extend_from_slice(chunk);
            }
            return;
        }
        let mut rest = chunk;
        while let Some(i) = rest.iter().position(|b| *b == b'\n') {
            if !self.skipping_line {
                self.buf.extend_from_slice(&rest[..i]);
                let line = std::mem::take(&mut self.buf);
                self.line(&line);
            }
            self.skipping_line = false;
            rest = &rest[i + 1..];
        }
        if self.buf.len() + rest.len() > MAX_LINE {
            self.buf.clear();
            self.skipping_line = true;
        } else if !self.skipping_line {
            self.buf.extend_from_slice(rest);
        }
    }

    /// The body ended: what it used.
    pub fn finish(&mut self) {
        let buf = std::mem::take(&mut self.buf);
        if self.sse {
            self.line(&buf);
        } else if let Ok(v) = serde_json::from_slice::<Value>(&buf) {
            self.object(&v);
        }
    }

    fn line(&mut self, line: &[u8]) {
        let Some(data) = line.strip_prefix(b"data:") else {
            return;
        };
        // Most events carry no usage: skip them without parsing.
        if !data.windows(7).any(|w| w == b"\"usage\"")
            && !data.windows(7).any(|w| w == b"\"model\"")
        {
            return;
        }
        if let Ok(v) = serde_json::from_slice::<Value>(data.trim_ascii()) {
            self.event(&v);
        }
    }

    fn set_model(&mut self, v: Option<&Value>) {
        if let Some(m) = v.and_then(Value::as_str).filter(|m| !m.is_empty()) {
            self.model = Some(m.to_owned());
        }
    }

    /// One streamed event.
    fn event(&mut self, v: &Value) {
        match self.api {
            Api::Messages => match v.get("type").and_then(Value::as_str) {
                Some("message_start") => {
                    let m = v.get("message").unwrap_or(&Value::Null);
                    self.set_model(m.get("model"));
                    if let Some(u) = m.get("usage") {
                        at_least(&mut self.usage, &claude_usage(u));
                    }
                }
                // Cumulative counts (output always; input and cache on newer APIs).
                Some("message_delta") => {
                    if let Some(u) = v.get("usage") {
                        at_least(&mut self.usage, &claude_usage(u));
                    }
                }
                _ => {}
            },
            Api::ChatCompletions => {
                self.set_model(v.get("model"));
                if let Some(u) = v.get("usage").filter(|u| u.is_object()) {
                    at_least(
                        &mut self.usage,
                        &openai_usage(
                            u,
                            "prompt_tokens",
                            "completion_tokens",
                            "prompt_tokens_details",
                        ),
                    );
                }
            }
            Api::Responses => {
                let kind = v.get("type").and_then(Value::as_str).unwrap_or_default();
                if let Some(r) = v.get("response") {
                    self.set_model(r.get("model"));
                    // response.completed, .incomplete and .failed all carry the final usage.
                    if kind.starts_with("response.")
                        && let Some(u) = r.get("usage").filter(|u| u.is_object())
                    {
                        at_least(
                            &mut self.usage,
                            &openai_usage(
                                u,
                                "input_tokens",
                                "output_tokens",
                                "input_tokens_details",
                            ),
                        );
                    }
                }
            }
        }
    }

    /// A whole (non-streamed) response.
    fn object(&mut self, v: &Value) {
        self.set_model(v.get("model"));
        let Some(u) = v.get("usage").filter(|u| u.is_object()) else {
            return;
        };
        let usage = match self.api {
            Api::Messages => claude_usage(u),
            Api::ChatCompletions => openai_usage(
                u,
                "prompt_tokens",
                "completion_tokens",
                "prompt_tokens_details",
            ),
            Api::Responses => {
                openai_usage(u, "input_tokens", "output_tokens", "input_tokens_details")
            }
        };
        at_least(&mut self.usage, &usage);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feed_in_pieces(m: &mut Meter, body: &str, piece: usize) {
        for c in body.as_bytes().chunks(piece) {
            m.feed(c);
        }
        m.finish();
    }

    #[test]
    fn anthropic_stream_takes_start_and_the_last_delta() {
        let body = concat!(
            "event: message_start\n",
            "data: {\"type\":\"message_start\",\"message\":{\"model\":\"claude-sonnet-4-5\",\"usage\":{\"input_tokens\":120,\"cache_read_input_tokens\":30,\"cache_creation_input_tokens\":7,\"output_tokens\":1}}}\n\n",
            "event: content_block_delta\n",
            "data: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"\\\"usage\\\" is not here\"}}\n\n",
            "event: message_delta\n",
            "data: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":15}}\n\n",
            "event: message_delta\n",
            "data: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":42}}\n\n",
            "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"
        );
        for piece in [1, 7, 4096] {
            let mut m = Meter::new(Api::Messages, "text/event-stream; charset=utf-8");
            feed_in_pieces(&mut m, body, piece);
            assert_eq!(
                m.usage,
                Usage {
                    input_tokens: 120,
                    output_tokens: 42,
                    cache_read_tokens: 30,
                    cache_write_tokens: 7
                },
                "piece {piece}"
            );
            assert_eq!(m.model.as_deref(), Some("claude-sonnet-4-5"));
        }
    }

    #[test]
    fn openai_chat_and_responses_keep_cached_tokens_apart() {
        let chat = "data: {\"model\":\"gpt-4o\",\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\ndata: {\"model\":\"gpt-4o\",\"choices\":[],\"usage\":{\"prompt_tokens\":100,\"completion_tokens\":9,\"prompt_tokens_details\":{\"cached_tokens\":40}}}\n\ndata: [DONE]\n\n";
        let mut m = Meter::new(Api::ChatCompletions, "text/event-stream");
        feed_in_pieces(&mut m, chat, 5);
        assert_eq!(
            (
                m.usage.input_tokens,
                m.usage.cache_read_tokens,
                m.usage.output_tokens
            ),
            (60, 40, 9)
        );
        let responses = "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"model\":\"gpt-5\",\"usage\":null}}\n\nevent: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"model\":\"gpt-5\",\"usage\":{\"input_tokens\":200,\"input_tokens_details\":{\"cached_tokens\":20},\"output_tokens\":40}}}\n\n";
        let mut m = Meter::new(Api::Responses, "text/event-stream");
        feed_in_pieces(&mut m, responses, 3);
        assert_eq!(
            (
                m.usage.input_tokens,
                m.usage.cache_read_tokens,
                m.usage.output_tokens
            ),
            (180, 20, 40)
        );
        assert_eq!(m.model.as_deref(), Some("gpt-5"));
    }

    #[test]
    fn whole_json_bodies() {
        let mut m = Meter::new(Api::Messages, "application/json");
        feed_in_pieces(
            &mut m,
            r#"{"model":"claude-haiku-4-5","usage":{"input_tokens":10,"output_tokens":2}}"#,
            4,
        );
        assert_eq!((m.usage.input_tokens, m.usage.output_tokens), (10, 2));
        let mut m = Meter::new(Api::ChatCompletions, "application/json");
        feed_in_pieces(
            &mut m,
            r#"{"model":"gpt-4o","usage":{"prompt_tokens":10,"completion_tokens":2}}"#,
            64,
        );
        assert_eq!((m.usage.input_tokens, m.usage.output_tokens), (10, 2));
        let mut m = Meter::new(Api::Responses, "application/json");
        feed_in_pieces(&mut m, "not json", 64);
        assert_eq!(m.usage, Usage::default());
    }
}
