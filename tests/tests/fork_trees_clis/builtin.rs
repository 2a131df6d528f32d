//! The built-in drivers' trees (`anthropic` on Messages, `openai` on Chat Completions,
//! run by `super::two_branches`): a fork edits notes.txt through the runner's own
//! tool-use loop, which keeps its conversation in the workspace's .git at the end; two
//! branches of it continue that conversation: their first model request carries the
//! parent's turns (its prompt, its tool call's result), then the new prompt as the last
//! user turn.

use super::{BRANCH_PROMPT, PARENT_PROMPT, PARENT_SAID, texts};
use forkyard_tests::scripted_model::Recorded;
use serde_json::Value;

/// Each branch's first request ends with the branch's prompt as a user turn of its own,
/// after the parent's prompt and its tool call's result.
pub fn assert_first_requests_continue_the_parent(driver: &str, calls: &[Recorded]) {
    let is_prompt = |m: &Value, p: &str| m["role"] == "user" && texts(m).iter().any(|t| t == p);
    let firsts: Vec<&Vec<Value>> = calls
        .iter()
        .filter_map(|c| c.body["messages"].as_array())
        .filter(|ms| ms.last().is_some_and(|m| is_prompt(m, BRANCH_PROMPT)))
        .collect();
    assert_eq!(
        firsts.len(),
        2,
        "{driver}: one first request per branch of {calls:#?}"
    );
    for messages in firsts {
        let before = &messages[..messages.len() - 1];
        assert!(
            before.iter().any(|m| is_prompt(m, PARENT_PROMPT)),
            "{driver}: {messages:#?}"
        );
        // A `tool` message (Chat Completions) or a `tool_result` block (Messages).
        let result = before.iter().any(|m| {
            let blocks = m["content"].as_array().cloned().unwrap_or_default();
            (m["role"] == "tool" && m["content"].to_string().contains(PARENT_SAID))
                || blocks.iter().any(|b| {
                    b["type"] == "tool_result" && b["content"].to_string().contains(PARENT_SAID)
                })
        });
        assert!(
            result,
            "{driver}: the parent's tool result is missing: {messages:#?}"
        );
    }
}
