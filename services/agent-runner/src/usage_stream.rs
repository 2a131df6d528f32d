//! Usage read from an agent CLI's stdout line by line, as it streams, so the command
//! driver can charge each model turn while the CLI runs.
//!
//! - `claude -p --output-format stream-json --verbose`: `{"type":"assistant","message":
//!   {"id":…,"model":…,"usage":{…}}}` per content block. One API message is printed once
//!   per content block under the same `message.id`, with the same (or a grown) usage, so
//!   only what a message's usage grew by since its last line counts. The last line,
//!   `{"type":"result",…,"total_cost_usd":…,"usage":{…}}`, carries the run's totals.
//! - `claude -p --output-format json`: just that result object, at the end.
//! - `codex exec --json`: `{"type":"turn.completed","usage":{…}}` per turn, whose
//!   `input_tokens` include `cached_input_tokens`; no totals and no price.

use crate::usage::{Reported, claude_usage, cost_of, u64_field};
use forkyard_proto::common::v1::Usage;
use serde_json::Value;
use std::collections::HashMap;

/// What one line of output says about usage.
#[derive(Debug, PartialEq)]
pub enum Reading {
    /// Tokens used since the last reading: a model turn (or the growth of one already
    /// read). `model` is the model the CLI names, if it does.
    Turn { usage: Usage, model: Option<String> },
    /// The CLI's totals for the whole run (and its own price, if it gives one).
    Total(Reported),
}

/// Keeps what each Claude message's usage was last seen as, so repeated lines of one
/// message are not counted twice.
#[derive(Debug, Default)]
pub struct UsageStream {
    by_message: HashMap<String, Usage>,
}

/// What `new` has beyond `old`, field by field.
pub fn grown(old: &Usage, new: &Usage) -> Usage {
    Usage {
        input_tokens: new.input_tokens.saturating_sub(old.input_tokens),
        output_tokens: new.output_tokens.saturating_sub(old.output_tokens),
        cache_read_tokens: new.cache_read_tokens.saturating_sub(old.cache_read_tokens),
        cache_write_tokens: new
            .cache_write_tokens
            .saturating_sub(old.cache_write_tokens),
    }
}

fn field_max(a: &Usage, b: &Usage) -> Usage {
    Usage {
        input_tokens: a.input_tokens.max(b.input_tokens),
        output_tokens: a.output_tokens.max(b.output_tokens),
        cache_read_tokens: a.cache_read_tokens.max(b.cache_read_tokens),
        cache_write_tokens: a.cache_write_tokens.max(b.cache_write_tokens),
    }
}

pub fn is_zero(u: &Usage) -> bool {
    *u == Usage::default()
}

impl UsageStream {
    /// The reading of one line of stdout, if it is a usage-bearing JSON event.
    pub fn line(&mut self, line: &str) -> Option<Reading> {
        let line = line.trim();
        if !(line.starts_with('{') && line.ends_with('}')) {
            return None;
        }
        let v: Value = serde_json::from_str(line).ok()?;
        match v.get("type").and_then(Value::as_str) {
            Some("assistant") => {
                let msg = v.get("message")?;
                let usage = claude_usage(msg.get("usage").filter(|u| u.is_object())?);
                let model = msg.get("model").and_then(Value::as_str).map(str::to_owned);
                let usage = match msg.get("id").and_then(Value::as_str) {
                    Some(id) => {
                        let seen = self.by_message.entry(id.to_owned()).or_default();
                        let delta = grown(seen, &usage);
                        *seen = field_max(seen, &usage);
                        delta
                    }
                    None => usage,
                };
                (!is_zero(&usage)).then_some(Reading::Turn { usage, model })
            }
            Some("turn.completed") => {
                let u = v.get("usage")?;
                let cached = u64_field(u, "cached_input_tokens");
                let usage = Usage {
                    input_tokens: u64_field(u, "input_tokens").saturating_sub(cached),
                    output_tokens: u64_field(u, "output_tokens"),
                    cache_read_tokens: cached,
                    cache_write_tokens: 0,
                };
                (!is_zero(&usage)).then_some(Reading::Turn { usage, model: None })
            }
            _ => {
                let cost_micros = cost_of(&v);
                let usage = v.get("usage").filter(|u| u.is_object());
                let is_result = v.get("type").and_then(Value::as_str) == Some("result");
                if cost_micros.is_none() && !(is_result && usage.is_some()) {
                    return None;
                }
                Some(Reading::Total(Reported {
                    usage: usage.map(claude_usage).unwrap_or_default(),
                    cost_micros,
                }))
            }
        }
    }
}

/// `a` with each field at least `b`'s.
pub fn at_least(a: &Usage, b: &Usage) -> Usage {
    field_max(a, b)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn turn(input: u64, output: u64) -> Usage {
        Usage {
            input_tokens: input,
            output_tokens: output,
            ..Default::default()
        }
    }

    #[test]
    fn counts_each_claude_message_once_and_its_growth() {
        let mut s = UsageStream::default();
        let text = r#"{"type":"assistant","message":{"id":"msg_1","model":"claude-sonnet-4-5","usage":{"input_tokens":100,"output_tokens":5,"cache_read_input_tokens":7}},"parent_tool_use_id":null}"#;
        let tool = r#"{"type":"assistant","message":{"id":"msg_1","model":"claude-sonnet-4-5","usage":{"input_tokens":100,"output_tokens":20,"cache_read_input_tokens":7}}}"#;
        let Some(Reading::Turn { usage, model }) = s.line(text) else {
            panic!("first line of msg_1");
        };
        assert_eq!(model.as_deref(), Some("claude-sonnet-4-5"));
        assert_eq!(
            (
                usage.input_tokens,
                usage.output_tokens,
                usage.cache_read_tokens
            ),
            (100, 5, 7)
        );
        // The same message again, for its tool_use block: only the 15 new output tokens.
        assert_eq!(
            s.line(tool),
            Some(Reading::Turn {
                usage: turn(0, 15),
                model: Some("claude-sonnet-4-5".into())
            })
        );
        assert_eq!(s.line(tool), None, "a repeat adds nothing");
        assert_eq!(s.line(r#"{"type":"user","message":{"content":[]}}"#), None);
        assert_eq!(s.line(r#"{"type":"system","subtype":"init"}"#), None);
        let result = r#"{"type":"result","subtype":"success","total_cost_usd":0.0123,"num_turns":2,"usage":{"input_tokens":300,"output_tokens":40}}"#;
        assert_eq!(
            s.line(result),
            Some(Reading::Total(Reported {
                usage: turn(300, 40),
                cost_micros: Some(12_300)
            }))
        );
    }

    #[test]
    fn reads_codex_turns_and_ignores_other_output() {
        let mut s = UsageStream::default();
        let line = r#"{"type":"turn.completed","usage":{"input_tokens":100,"cached_input_tokens":40,"output_tokens":7}}"#;
        let Some(Reading::Turn { usage, model: None }) = s.line(line) else {
            panic!("codex turn");
        };
        assert_eq!(
            (
                usage.input_tokens,
                usage.cache_read_tokens,
                usage.output_tokens
            ),
            (60, 40, 7)
        );
        // Two identical turns are two turns (codex events have no message id).
        assert!(s.line(line).is_some());
        for other in [
            "plain text",
            "{not json}",
            r#"{"type":"item.completed","item":{"type":"agent_message","text":"hi"}}"#,
            r#"{"type":"turn.completed"}"#,
            r#"{"no_cost":1}"#,
            "",
        ] {
            assert_eq!(s.line(other), None, "{other}");
        }
    }
}
