//! Fork trees for the built-in drivers (`anthropic`, `openai`): their conversation lives
//! in the runner, so at the agent's end it is kept in the workspace's git directory
//! ([`CONVERSATION`]: a snapshot of the workspace carries it, a patch never does), under
//! the fork's session id. A branch reads its parent's from its sandbox (the parent's
//! workspace at its end), checks it is that session's, and goes on from it with the
//! branch's prompt as the next user turn. Only the branch's own turns are charged to it:
//! the parent's come back as context, never as turns.

use crate::{error::AgentError, tools::Sandbox};
use forkyard_proto::{
    agent::v1::RunAgentRequest,
    sandbox::v1::{ReadFileRequest, WriteFileRequest},
};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// Where the conversation is kept, relative to the workspace (as WriteFile takes it).
pub const CONVERSATION: &str = ".git/forkyard-conversation.json";
/// The largest conversation kept (ReadFile gives at most 64 MiB).
const MAX_BYTES: usize = 32 << 20;

#[derive(Serialize, Deserialize)]
struct Kept {
    session: String,
    driver: String,
    messages: Vec<Value>,
}

/// Keep `messages` (the driver's wire format) under `session` in the sandbox; a failure
/// is logged, and leaves the fork without a branch point for its conversation.
pub(super) async fn keep(
    sandbox: &mut Sandbox,
    req: &RunAgentRequest,
    session: &str,
    driver: &str,
    messages: &[Value],
) {
    let kept = json!({"session": session, "driver": driver, "messages": messages});
    let content = kept.to_string().into_bytes();
    if content.len() > MAX_BYTES {
        tracing::warn!(run_id = %req.run_id, fork = req.fork, bytes = content.len(), "conversation too large to keep for branches");
        return;
    }
    let write = WriteFileRequest {
        sandbox_id: sandbox.sandbox_id.clone(),
        path: CONVERSATION.into(),
        content,
        mode: 0o600,
    };
    if let Err(e) = sandbox.client.write_file(write).await {
        tracing::warn!(run_id = %req.run_id, fork = req.fork, error = %e.message(), "conversation not kept for branches");
    }
}

/// A branch's parent's conversation, from the parent's workspace in this sandbox: none
/// for a fork that is no branch. A branch whose parent's conversation is not there (or
/// is another session's or driver's) fails: it would silently start a new one.
pub(super) async fn parents(
    sandbox: &mut Sandbox,
    req: &RunAgentRequest,
    driver: &str,
) -> Result<Option<Vec<Value>>, AgentError> {
    let Some(b) = req.branch_of.as_ref() else {
        return Ok(None);
    };
    // Final, as a sandbox that refuses work is: another attempt finds the same files.
    let missing = |why: &str| AgentError::Sandbox {
        sandbox_id: req.sandbox_id.clone(),
        message: format!(
            "branch of fork {}: its conversation cannot be continued: {why}",
            b.parent_fork
        ),
    };
    let read = ReadFileRequest {
        sandbox_id: sandbox.sandbox_id.clone(),
        path: CONVERSATION.into(),
        max_bytes: MAX_BYTES as u64 + 1,
    };
    let content = match sandbox.client.read_file(read).await {
        Ok(r) => r.into_inner().content,
        Err(s) if s.code() == tonic::Code::NotFound && !s.message().contains("sandbox") => {
            return Err(missing("the parent kept none"));
        }
        Err(s) => {
            return Err(AgentError::Unavailable {
                endpoint: sandbox.endpoint.clone(),
                message: s.message().to_owned(),
            });
        }
    };
    let kept: Kept = serde_json::from_slice(&content).map_err(|_| missing("it is unreadable"))?;
    if kept.session != b.session || kept.driver != driver {
        return Err(missing("the workspace holds another session's"));
    }
    Ok(Some(kept.messages))
}

/// `messages` going on with `prompt` as the next user turn: a last model turn whose tool
/// calls never got their results (the parent was stopped during them) is dropped, and a
/// prompt after tool results joins their user message (the Messages API alternates).
pub(super) fn continued(driver: &str, mut messages: Vec<Value>, prompt: &str) -> Vec<Value> {
    let unanswered = |m: &Value| {
        m["role"] == "assistant"
            && (m["tool_calls"].as_array().is_some_and(|c| !c.is_empty())
                || m["content"]
                    .as_array()
                    .is_some_and(|bs| bs.iter().any(|b| b["type"] == "tool_use")))
    };
    if messages.last().is_some_and(unanswered) {
        messages.pop();
    }
    let text = json!({"type": "text", "text": prompt});
    match messages.last_mut() {
        Some(last) if driver == "anthropic" && last["role"] == "user" => {
            let earlier = last["content"].take();
            last["content"] = match earlier {
                Value::Array(mut blocks) => {
                    blocks.push(text);
                    Value::Array(blocks)
                }
                Value::String(s) => json!([{"type": "text", "text": s}, text]),
                _ => json!([text]),
            };
        }
        _ => messages.push(json!({"role": "user", "content": prompt})),
    }
    messages
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_finished_conversation_goes_on_with_the_prompt_as_a_user_turn() {
        let chat = vec![
            json!({"role": "system", "content": "s"}),
            json!({"role": "user", "content": "edit"}),
            json!({"role": "assistant", "content": "done"}),
        ];
        let c = continued("openai", chat, "now add tests");
        assert_eq!(c.len(), 4);
        assert_eq!(c[3], json!({"role": "user", "content": "now add tests"}));
    }

    #[test]
    fn unanswered_tool_calls_are_dropped_and_tool_results_take_the_prompt() {
        let messages = vec![
            json!({"role": "user", "content": "edit"}),
            json!({"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "bash", "input": {}}]}),
            json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "ok"}]}),
            json!({"role": "assistant", "content": [{"type": "tool_use", "id": "t2", "name": "bash", "input": {}}]}),
        ];
        let c = continued("anthropic", messages, "go on");
        assert_eq!(c.len(), 3, "{c:#?}");
        let blocks = c[2]["content"].as_array().unwrap();
        assert_eq!(blocks[0]["type"], "tool_result");
        assert_eq!(blocks[1], json!({"type": "text", "text": "go on"}));
        let openai = vec![
            json!({"role": "user", "content": "edit"}),
            json!({"role": "assistant", "content": null, "tool_calls": [{"id": "c1"}]}),
        ];
        let c = continued("openai", openai, "go on");
        assert_eq!(
            c,
            vec![
                json!({"role": "user", "content": "edit"}),
                json!({"role": "user", "content": "go on"})
            ]
        );
    }
}
