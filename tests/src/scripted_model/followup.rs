//! The scripted model's follow-ups: a conversation continued with a new instruction (a
//! branched or continued session) is answered with the follow-up's command, and only if
//! the request carries the earlier turns. Messages requests (Claude Code, the built-in
//! anthropic driver) hold the conversation in `messages`, tool results as `tool_result`
//! blocks; Responses requests (Codex) in `input`, tool results as `function_call_output`
//! items; Chat Completions requests (the built-in openai driver) in `messages`, tool
//! results as `tool` messages.

use super::{Body, Script, anthropic, chat, json_response, responses};
use hyper::Response;
use serde_json::{Value, json};

/// A later instruction in the same conversation (a branched or continued session).
#[derive(Debug, Clone)]
pub struct Followup {
    /// The user turn that starts the follow-up.
    pub prompt: String,
    /// The command the model asks for after it.
    pub command: String,
    /// Text a tool result before the prompt must hold; a request without it is answered
    /// 400, so a follow-up that lost the earlier turns fails.
    pub earlier: String,
}

/// Where a Messages request stands in a follow-up.
struct FollowupTurn {
    /// The index of the follow-up's prompt in the messages.
    at: usize,
    /// A tool result before the follow-up's prompt holds `earlier`.
    has_earlier: bool,
    /// A tool result comes after the prompt: the follow-up's command ran.
    answered: bool,
}

/// The follow-up turn `body` is in: none unless a user message's text is `f.prompt`.
fn followup_turn(f: &Followup, body: &Value) -> Option<FollowupTurn> {
    let messages = body["messages"]
        .as_array()
        .or_else(|| body["input"].as_array())?;
    let is_prompt = |m: &Value| {
        m["role"] == "user"
            && (m["content"] == f.prompt.as_str()
                || blocks(m).iter().any(|b| b["text"] == f.prompt.as_str()))
    };
    let at = messages.iter().rposition(is_prompt)?;
    // The prompt's own message may open with the tool results of the turn before it (a
    // session continued from a running agent's point: two user turns joined in one).
    Some(FollowupTurn {
        at,
        has_earlier: tool_results(&messages[..=at])
            .iter()
            .any(|r| r.contains(&f.earlier)),
        answered: !tool_results(&messages[at + 1..]).is_empty(),
    })
}

fn blocks(m: &Value) -> Vec<Value> {
    m["content"].as_array().cloned().unwrap_or_default()
}

/// The tool results among a conversation's messages (or Responses items), as text.
pub(super) fn tool_results(ms: &[Value]) -> Vec<String> {
    let output = |m: &Value| {
        matches!(
            m["type"].as_str(),
            Some("function_call_output" | "custom_tool_call_output")
        )
        .then(|| m["output"].to_string())
    };
    let blocks = |m: &Value| {
        blocks(m)
            .into_iter()
            .filter(|b| b["type"] == "tool_result")
            .map(|b| b["content"].to_string())
            .collect::<Vec<_>>()
    };
    let chat = |m: &Value| (m["role"] == "tool").then(|| m["content"].to_string());
    ms.iter()
        .flat_map(|m| {
            output(m)
                .or_else(|| chat(m))
                .map_or_else(|| blocks(m), |o| vec![o])
        })
        .collect()
}

/// The answer to a Messages, Responses or Chat Completions request (`path`) in the
/// latest of `script`'s
/// follow-ups it is in: none when it is in none; 400 when it lost the earlier turns.
pub(super) fn answer(
    script: &Script,
    path: &str,
    body: &Value,
    model: &str,
    n: usize,
) -> Option<Response<Body>> {
    let (f, turn) = script
        .followups
        .iter()
        .filter_map(|f| Some((f, followup_turn(f, body)?)))
        .max_by_key(|(_, t)| t.at)?;
    if !turn.has_earlier {
        return Some(json_response(
            400,
            &json!({"type": "error", "error": {"type": "invalid_request_error",
                "message": "scripted: a follow-up without the earlier turns"}}),
        ));
    }
    let script = Script {
        command: f.command.clone(),
        ..script.clone()
    };
    Some(match path {
        "/v1/responses" => responses(&script, model, !turn.answered, n),
        "/v1/chat/completions" => chat(&script, body, model, !turn.answered, n),
        _ => anthropic(&script, body, model, !turn.answered, n),
    })
}
