//! The codex tree (run by `super::two_branches`): a fork edits notes.txt, two branches of
//! it continue its thread (`codex exec fork <session> <prompt>`, its home travelling in
//! the snapshot's .git): their first Responses request carries the parent's items, its
//! tool call and output among them, then the new prompt.

use super::{BRANCH_PROMPT, PARENT_PROMPT, PARENT_SAID, texts};
use forkyard_tests::scripted_model::Recorded;
use serde_json::Value;

/// Each branch's first request ends with the branch's prompt, after the parent's items:
/// its prompt, its `exec_command` call and that call's output.
pub fn assert_first_requests_continue_the_parent(_driver: &str, calls: &[Recorded]) {
    let is_prompt = |m: &Value, p: &str| m["role"] == "user" && texts(m).iter().any(|t| t == p);
    let firsts: Vec<&Vec<Value>> = calls
        .iter()
        .filter_map(|c| c.body["input"].as_array())
        .filter(|items| items.last().is_some_and(|m| is_prompt(m, BRANCH_PROMPT)))
        .collect();
    assert_eq!(
        firsts.len(),
        2,
        "one first request per branch of {} calls",
        calls.len()
    );
    for items in firsts {
        let before = &items[..items.len() - 1];
        assert!(
            before.iter().any(|m| is_prompt(m, PARENT_PROMPT)),
            "{items:#?}"
        );
        let call = before.iter().any(|i| {
            i["type"] == "function_call" && i["arguments"].to_string().contains(PARENT_SAID)
        });
        let output = before.iter().any(|i| {
            i["type"] == "function_call_output" && i["output"].to_string().contains(PARENT_SAID)
        });
        assert!(call && output, "the parent's turns are missing: {items:#?}");
    }
}
