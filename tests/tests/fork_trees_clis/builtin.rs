//! The built-in drivers' trees (`anthropic` on Messages, `openai` on Chat Completions):
//! a fork edits notes.txt through the runner's own tool-use loop, which keeps its
//! conversation in the workspace's .git at the end; two branches of it continue that
//! conversation: their first model request carries the parent's turns (its prompt, its
//! tool call's result), then the new prompt as the last user turn.

use super::{
    BRANCH_PROMPT, PARENT_PROMPT, PARENT_SAID, all_finished, assert_child,
    assert_children_pay_their_own_calls, assert_ledger_holds, branch, calls_on, continued_branch,
    launch_branchable, texts,
};
use crate::agent_cli::forks::notes_repo;
use forkyard_proto::{common::v1::ForkStatus, gateway::v1::RunState};
use forkyard_tests::{
    Mesh,
    scripted_model::{Recorded, ScriptedModel},
    support::{Gateway, fork_result, wait_finished},
};
use serde_json::Value;
use std::time::Duration;

/// A tree of `driver` on `model_name`, whose calls go to `path`, each costing `per_call`.
pub async fn tree(
    mesh: &Mesh,
    model: &ScriptedModel,
    (driver, model_name): (&str, &str),
    path: &str,
    per_call: i64,
) {
    let dir = tempfile::tempdir().unwrap();
    let repo_dir = notes_repo(dir.path());
    let mut gw = Gateway::new(mesh.channel("gateway").await.unwrap());
    let run_id = launch_branchable(&mut gw, &repo_dir, driver, model_name).await;
    let run = all_finished(&mut gw, &run_id, 1).await;
    assert_eq!(
        run.forks[0].status,
        ForkStatus::Succeeded as i32,
        "{driver}: {run:#?}"
    );
    let parent = fork_result(&mut gw, &run_id, 1).await;
    assert!(!parent.agent_session.is_empty(), "{driver}: no session");
    assert!(parent.patch.contains("+parent edit"), "{}", parent.patch);
    let parent_calls = calls_on(model, path).len();

    assert_eq!(
        branch(&mut gw, &run_id, 1, 2, BRANCH_PROMPT).await,
        vec![2, 3]
    );
    all_finished(&mut gw, &run_id, 3).await;
    let mut children = Vec::new();
    for n in 2..=3 {
        let child = fork_result(&mut gw, &run_id, n).await;
        assert_child(&child, n, &parent);
        children.push(child);
    }
    let calls = calls_on(model, path);
    assert_first_requests_continue_the_parent(driver, &calls[parent_calls..]);
    assert_children_pay_their_own_calls(
        (parent_calls, calls.len() - parent_calls),
        per_call,
        &parent,
        &children,
    );

    let grandchild = continued_branch(&mut gw, &run_id, (model, path), &children[1], 4).await;
    let run = wait_finished(&mut gw, &run_id, Duration::from_secs(120)).await;
    assert_eq!(run.state, RunState::Completed as i32, "{run:#?}");
    let tree: Vec<_> = children.into_iter().chain([parent, grandchild]).collect();
    assert_ledger_holds(mesh, &run_id, &tree).await;
}

/// Each branch's first request ends with the branch's prompt as a user turn of its own,
/// after the parent's prompt and its tool call's result.
fn assert_first_requests_continue_the_parent(driver: &str, calls: &[Recorded]) {
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
