//! A fork's transcript (the agent runner's JSON lines, `ForkResult.transcript`) read as a
//! conversation: who said what, each tool call with its input and its result, long
//! parts folded in `<details>`. Two shapes of line carry the conversation: `message`
//! (LLM drivers: an Anthropic or OpenAI wire message) and `output` (command drivers:
//! a line of the CLI's stdout, its JSON event when it printed one, such as claude-code's
//! stream-json). Bookkeeping lines (start, resume, end) become one-line notes; usage and
//! checkpoints are left out. Every value reaches the page through maud, so escaped.

use maud::{Markup, html};
use serde_json::Value;

/// Most entries drawn; a longer transcript says how many were left out.
const MAX_ENTRIES: usize = 2_000;
/// Text longer than this (bytes or lines) is folded, its first line the summary.
const FOLD_BYTES: usize = 1_200;
const FOLD_LINES: usize = 20;
/// Most bytes of one block shown; the rest is cut with a note.
const MAX_BLOCK_BYTES: usize = 64 * 1024;

/// One piece of a message.
#[derive(Debug, PartialEq)]
pub enum Block {
    Text(String),
    ToolCall { name: String, input: String },
    ToolResult { text: String, is_error: bool },
}

/// One entry of the conversation.
#[derive(Debug, PartialEq)]
pub enum Entry {
    Message {
        role: String,
        blocks: Vec<Block>,
    },
    /// A bookkeeping line: "started: driver command", "ended: exit 0".
    Note(String),
    /// Plain stdout lines of a command agent, consecutive ones together.
    Output(String),
}

/// The transcript's entries, in order.
pub fn parse(jsonl: &str) -> Vec<Entry> {
    let mut out: Vec<Entry> = Vec::new();
    for line in jsonl.lines().filter(|l| !l.trim().is_empty()) {
        let Ok(v) = serde_json::from_str::<Value>(line) else {
            push_output(&mut out, line);
            continue;
        };
        match str_of(&v, "type") {
            "message" => out.extend(message(&v["message"])),
            "output" => match v.get("text").and_then(Value::as_str) {
                Some(text) => push_output(&mut out, text),
                None => out.extend(cli_event(&v["event"])),
            },
            "start" => out.push(Entry::Note(format!(
                "started: driver {}{}",
                str_of(&v, "driver"),
                non_empty(" · model ", str_of(&v, "model"))
            ))),
            "resume" => out.push(Entry::Note(format!(
                "resumed after {} turns",
                v["turns"].as_u64().unwrap_or(0)
            ))),
            "end" => out.push(Entry::Note(end_note(&v))),
            "output_truncated" => out.push(Entry::Note("output cut here".into())),
            _ => {}
        }
    }
    out
}

fn end_note(v: &Value) -> String {
    let mut note = format!("ended: {}", str_of(v, "reason"));
    if let Some(code) = v["exit_code"].as_i64() {
        note.push_str(&format!(" · exit {code}"));
    }
    if let Some(turns) = v["turns"].as_u64() {
        note.push_str(&format!(" · {turns} turns"));
    }
    note + &non_empty(" · ", str_of(v, "error"))
}

fn str_of<'a>(v: &'a Value, key: &str) -> &'a str {
    v.get(key).and_then(Value::as_str).unwrap_or_default()
}

fn non_empty(prefix: &str, s: &str) -> String {
    if s.is_empty() {
        String::new()
    } else {
        format!("{prefix}{s}")
    }
}

fn push_output(out: &mut Vec<Entry>, text: &str) {
    if let Some(Entry::Output(prev)) = out.last_mut() {
        prev.push('\n');
        prev.push_str(text);
    } else {
        out.push(Entry::Output(text.to_owned()));
    }
}

/// A command agent's JSON event: claude-code's `assistant`/`user` carry a message,
/// `result` its last answer; anything else is shown as it came, folded.
fn cli_event(ev: &Value) -> Option<Entry> {
    match str_of(ev, "type") {
        "assistant" | "user" => message(&ev["message"]),
        "result" => {
            let answer = str_of(ev, "result");
            (!answer.is_empty()).then(|| Entry::Message {
                role: "result".into(),
                blocks: vec![Block::Text(answer.to_owned())],
            })
        }
        "system" => Some(Entry::Note(format!(
            "system: {}{}",
            str_of(ev, "subtype"),
            non_empty(" · model ", str_of(ev, "model"))
        ))),
        _ => Some(Entry::Output(ev.to_string())),
    }
}

/// An Anthropic or OpenAI message.
fn message(m: &Value) -> Option<Entry> {
    let role = str_of(m, "role");
    let mut blocks = Vec::new();
    match &m["content"] {
        Value::String(s) if !s.is_empty() => blocks.push(text_or_result(role, s.clone(), false)),
        Value::Array(parts) => blocks.extend(parts.iter().filter_map(anthropic_block)),
        _ => {}
    }
    // OpenAI: the assistant's calls beside its content.
    for call in m["tool_calls"].as_array().into_iter().flatten() {
        let f = &call["function"];
        blocks.push(Block::ToolCall {
            name: str_of(f, "name").to_owned(),
            input: pretty_json_text(str_of(f, "arguments")),
        });
    }
    (!blocks.is_empty() && !role.is_empty()).then(|| Entry::Message {
        role: role.to_owned(),
        blocks,
    })
}

fn text_or_result(role: &str, text: String, is_error: bool) -> Block {
    if role == "tool" {
        Block::ToolResult { text, is_error }
    } else {
        Block::Text(text)
    }
}

fn anthropic_block(b: &Value) -> Option<Block> {
    match str_of(b, "type") {
        "text" => {
            let text = str_of(b, "text");
            (!text.is_empty()).then(|| Block::Text(text.to_owned()))
        }
        "tool_use" => Some(Block::ToolCall {
            name: str_of(b, "name").to_owned(),
            input: serde_json::to_string_pretty(&b["input"]).unwrap_or_default(),
        }),
        "tool_result" => Some(Block::ToolResult {
            text: match &b["content"] {
                Value::String(s) => s.clone(),
                Value::Array(parts) => parts
                    .iter()
                    .map(|p| str_of(p, "text"))
                    .collect::<Vec<_>>()
                    .join("\n"),
                other => other.to_string(),
            },
            is_error: b["is_error"].as_bool().unwrap_or(false),
        }),
        _ => None,
    }
}

/// A JSON text (OpenAI's arguments) pretty-printed, or as it came when it is not JSON.
fn pretty_json_text(s: &str) -> String {
    serde_json::from_str::<Value>(s)
        .ok()
        .and_then(|v| serde_json::to_string_pretty(&v).ok())
        .unwrap_or_else(|| s.to_owned())
}

/// The transcript as a conversation; a note when there is none.
pub fn render(jsonl: &str) -> Markup {
    let entries = parse(jsonl);
    if entries.is_empty() {
        return html! { p #transcript .muted { "No transcript: the agent ran without one, or its runner no longer holds it." } };
    }
    let left_out = entries.len().saturating_sub(MAX_ENTRIES);
    html! {
        ol #transcript .transcript {
            @for e in entries.iter().take(MAX_ENTRIES) { (entry(e)) }
        }
        @if left_out > 0 { p.muted { (left_out) " more entries not shown." } }
    }
}

fn entry(e: &Entry) -> Markup {
    match e {
        Entry::Note(n) => html! { li.note { (n) } },
        Entry::Output(text) => html! {
            li.msg.output { p.role { "output" } (folded(text, "output")) }
        },
        Entry::Message { role, blocks } => html! {
            li class=(format!("msg role-{}", css_word(role))) {
                p.role { (role) }
                @for b in blocks { (block(b)) }
            }
        },
    }
}

fn block(b: &Block) -> Markup {
    match b {
        Block::Text(t) => folded(t, "text"),
        Block::ToolCall { name, input } => html! {
            details.tool-call open[is_short(input)] {
                summary { "tool call: " code { (name) } }
                pre { (cut(input)) }
            }
        },
        Block::ToolResult { text, is_error } => html! {
            details.tool-result open[is_short(text)] {
                summary { @if *is_error { "tool result (error)" } @else { "tool result" } }
                pre { (cut(text)) }
            }
        },
    }
}

/// Text shown whole when short, else folded under its first line.
fn folded(text: &str, class: &str) -> Markup {
    if text.len() <= FOLD_BYTES && text.lines().count() <= FOLD_LINES {
        return html! { pre class=(class) { (text) } };
    }
    let first: String = text
        .lines()
        .next()
        .unwrap_or_default()
        .chars()
        .take(120)
        .collect();
    html! {
        details class=(class) {
            summary { (first) " … (" (text.lines().count()) " lines)" }
            pre { (cut(text)) }
        }
    }
}

fn is_short(s: &str) -> bool {
    s.len() <= 400 && s.lines().count() <= 8
}

fn cut(s: &str) -> String {
    if s.len() <= MAX_BLOCK_BYTES {
        return s.to_owned();
    }
    let mut end = MAX_BLOCK_BYTES;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}\n… ({} more bytes)", &s[..end], s.len() - end)
}

/// A role as a class name: only lowercase letters pass.
fn css_word(s: &str) -> String {
    s.chars().filter(char::is_ascii_lowercase).collect()
}

#[cfg(test)]
#[path = "transcript_tests.rs"]
mod tests;
