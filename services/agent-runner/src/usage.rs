//! Usage reported by agent CLIs. Programs such as `claude -p --output-format json`
//! print one JSON object whose `total_cost_usd` and `usage` fields say what the run cost;
//! the command driver reads the last JSON object line of stdout.

use forkyard_proto::common::v1::Usage;
use serde_json::Value;

#[derive(Debug, Default, PartialEq)]
pub struct Reported {
    pub usage: Usage,
    pub cost_micros: i64,
}

/// Parse a JSON number's text as micro-USD exactly (rounding half up past 6 decimals),
/// so "0.1" is 100000, not 99999.
fn usd_text_to_micros(text: &str) -> Option<i64> {
    let t = text.trim();
    if t.starts_with('-') || t.contains(['e', 'E']) {
        return None;
    }
    let (whole, frac) = t.split_once('.').unwrap_or((t, ""));
    if whole.is_empty() || !whole.bytes().all(|b| b.is_ascii_digit()) || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let whole: i64 = whole.parse().ok()?;
    let mut digits: Vec<u8> = frac.bytes().map(|b| b - b'0').collect();
    let round_up = digits.get(6).is_some_and(|d| *d >= 5);
    digits.truncate(6);
    digits.resize(6, 0);
    let mut micros = digits.iter().fold(0i64, |acc, d| acc * 10 + i64::from(*d));
    if round_up {
        micros += 1;
    }
    whole.checked_mul(1_000_000)?.checked_add(micros)
}

fn u64_field(v: &Value, key: &str) -> u64 {
    v.get(key).and_then(Value::as_u64).unwrap_or(0)
}

/// The usage in the last stdout line that is a JSON object, if any.
pub fn from_stdout(stdout: &str) -> Option<Reported> {
    let line = stdout
        .lines()
        .rev()
        .map(str::trim)
        .find(|l| l.starts_with('{') && l.ends_with('}'))?;
    let v: Value = serde_json::from_str(line).ok()?;
    let cost = v.get("total_cost_usd").or_else(|| v.get("cost_usd"))?;
    let cost_micros = match cost {
        Value::Number(n) => usd_text_to_micros(&n.to_string())?,
        Value::String(s) => usd_text_to_micros(s)?,
        _ => return None,
    };
    let u = v.get("usage").cloned().unwrap_or(Value::Null);
    Some(Reported {
        cost_micros,
        usage: Usage {
            input_tokens: u64_field(&u, "input_tokens"),
            output_tokens: u64_field(&u, "output_tokens"),
            cache_read_tokens: u64_field(&u, "cache_read_input_tokens"),
            cache_write_tokens: u64_field(&u, "cache_creation_input_tokens"),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_claude_cli_json_output() {
        let out = "working...\n{\"type\":\"result\",\"total_cost_usd\":0.1,\"usage\":{\"input_tokens\":1200,\"output_tokens\":345,\"cache_read_input_tokens\":7}}\n";
        let r = from_stdout(out).unwrap();
        assert_eq!(r.cost_micros, 100_000);
        assert_eq!(r.usage.input_tokens, 1200);
        assert_eq!(r.usage.output_tokens, 345);
        assert_eq!(r.usage.cache_read_tokens, 7);
    }

    #[test]
    fn rounds_past_micro_precision() {
        assert_eq!(usd_text_to_micros("0.0000015"), Some(2));
        assert_eq!(usd_text_to_micros("0.0000014"), Some(1));
        assert_eq!(usd_text_to_micros("12"), Some(12_000_000));
        assert_eq!(usd_text_to_micros("-1"), None);
        assert_eq!(usd_text_to_micros("1e3"), None);
        // Agent output is untrusted: nothing it prints may panic the runner.
        for bad in ["0. 5", "0.-5", "", ".", "abc", "1.2.3", "99999999999999999999", "0.12345678901234567890"] {
            let _ = usd_text_to_micros(bad);
        }
        assert_eq!(usd_text_to_micros("0. 5"), None);
        assert_eq!(usd_text_to_micros("0.12345678901234567890"), Some(123_457));
    }

    #[test]
    fn plain_output_reports_nothing() {
        assert_eq!(from_stdout("hello\nworld\n"), None);
        assert_eq!(from_stdout("{\"no_cost\":1}"), None);
        assert_eq!(from_stdout("{not json}"), None);
    }
}
