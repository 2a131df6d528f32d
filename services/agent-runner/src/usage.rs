//! Usage reported by agent CLIs. `claude -p --output-format json` prints one JSON object
//! whose `total_cost_usd` and `usage` (input/output and cache tokens) say what the run
//! cost; `codex exec --json` prints JSON lines whose `turn.completed` events carry token
//! usage without a price. The command driver reads either from stdout.

use forkyard_proto::{Usd, common::v1::Usage};
use serde_json::Value;

#[derive(Debug, Default, PartialEq)]
pub struct Reported {
    pub usage: Usage,
    /// The CLI's own price, when it reports one.
    pub cost_micros: Option<i64>,
}

pub(crate) fn u64_field(v: &Value, key: &str) -> u64 {
    v.get(key).and_then(Value::as_u64).unwrap_or(0)
}

pub(crate) fn cost_of(v: &Value) -> Option<i64> {
    match v.get("total_cost_usd").or_else(|| v.get("cost_usd"))? {
        Value::Number(n) => Usd::parse_reported(&n.to_string()).map(Usd::micros),
        Value::String(s) => Usd::parse_reported(s).map(Usd::micros),
        _ => None,
    }
}

/// Anthropic-style usage: input tokens exclude the cache tokens.
pub(crate) fn claude_usage(u: &Value) -> Usage {
    Usage {
        input_tokens: u64_field(u, "input_tokens"),
        output_tokens: u64_field(u, "output_tokens"),
        cache_read_tokens: u64_field(u, "cache_read_input_tokens"),
        cache_write_tokens: u64_field(u, "cache_creation_input_tokens"),
    }
}

/// OpenAI counts cached prompt tokens inside the prompt; the price table keeps them apart.
pub(crate) fn openai_usage(u: &Value, input: &str, output: &str, details: &str) -> Usage {
    let cached = u.get(details).map_or(0, |d| u64_field(d, "cached_tokens"));
    Usage {
        input_tokens: u64_field(u, input).saturating_sub(cached),
        output_tokens: u64_field(u, output),
        cache_read_tokens: cached,
        cache_write_tokens: 0,
    }
}

/// The result object: the last one-line JSON object, else a pretty-printed object that
/// ends stdout (starting at the last line that is just `{`).
fn result_object(stdout: &str) -> Option<Value> {
    let line = stdout
        .lines()
        .rev()
        .map(str::trim)
        .find(|l| l.starts_with('{') && l.ends_with('}'))
        .and_then(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| cost_of(v).is_some() || v.get("usage").is_some_and(Value::is_object));
    line.or_else(|| {
        let start = stdout
            .rfind("\n{\n")
            .map(|i| i + 1)
            .or_else(|| stdout.starts_with("{\n").then_some(0))?;
        serde_json::from_str(stdout[start..].trim()).ok()
    })
}

/// Codex-style JSON lines: the sum of every `turn.completed` event's usage, whose
/// `input_tokens` include `cached_input_tokens`.
fn codex_events(stdout: &str) -> Option<Usage> {
    let mut total: Option<Usage> = None;
    for line in stdout.lines().map(str::trim).filter(|l| l.starts_with('{')) {
        let Ok(v) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        if v.get("type").and_then(Value::as_str) != Some("turn.completed") {
            continue;
        }
        let u = v.get("usage").cloned().unwrap_or(Value::Null);
        let cached = u64_field(&u, "cached_input_tokens");
        let t = total.get_or_insert_with(Usage::default);
        t.input_tokens += u64_field(&u, "input_tokens").saturating_sub(cached);
        t.cache_read_tokens += cached;
        t.output_tokens += u64_field(&u, "output_tokens");
    }
    total
}

/// The usage (and cost, if the CLI priced it) stdout reports, if any.
pub fn from_stdout(stdout: &str) -> Option<Reported> {
    if let Some(usage) = codex_events(stdout) {
        return Some(Reported {
            usage,
            cost_micros: None,
        });
    }
    if let Some(v) = result_object(stdout) {
        let cost_micros = cost_of(&v);
        let u = v.get("usage").cloned().unwrap_or(Value::Null);
        if cost_micros.is_some() || u.is_object() {
            return Some(Reported {
                cost_micros,
                usage: claude_usage(&u),
            });
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_claude_cli_json_output() {
        let out = "working...\n{\"type\":\"result\",\"subtype\":\"success\",\"total_cost_usd\":0.1,\"usage\":{\"input_tokens\":1200,\"output_tokens\":345,\"cache_read_input_tokens\":7,\"cache_creation_input_tokens\":9}}\n";
        let r = from_stdout(out).unwrap();
        assert_eq!(r.cost_micros, Some(100_000));
        assert_eq!(r.usage.input_tokens, 1200);
        assert_eq!(r.usage.output_tokens, 345);
        assert_eq!(r.usage.cache_read_tokens, 7);
        assert_eq!(r.usage.cache_write_tokens, 9);
    }

    #[test]
    fn reads_pretty_printed_results_and_codex_events() {
        let pretty = "log line\n{\n  \"total_cost_usd\": 0.25,\n  \"usage\": {\"input_tokens\": 10, \"output_tokens\": 2}\n}\n";
        let r = from_stdout(pretty).unwrap();
        assert_eq!(r.cost_micros, Some(250_000));
        assert_eq!(r.usage.input_tokens, 10);
        let codex = "{\"type\":\"thread.started\"}\n{\"type\":\"turn.completed\",\"usage\":{\"input_tokens\":100,\"cached_input_tokens\":40,\"output_tokens\":7}}\n{\"type\":\"turn.completed\",\"usage\":{\"input_tokens\":50,\"cached_input_tokens\":0,\"output_tokens\":3}}\n";
        let r = from_stdout(codex).unwrap();
        assert_eq!(r.cost_micros, None);
        assert_eq!(
            (
                r.usage.input_tokens,
                r.usage.cache_read_tokens,
                r.usage.output_tokens
            ),
            (110, 40, 10)
        );
    }

    #[test]
    fn plain_output_reports_nothing() {
        assert_eq!(from_stdout("hello\nworld\n"), None);
        assert_eq!(from_stdout("{\"no_cost\":1}"), None);
        assert_eq!(from_stdout("{not json}"), None);
    }
}
