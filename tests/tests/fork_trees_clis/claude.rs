//! The claude-code tree: a fork edits notes.txt, three branches of it continue its
//! session (`claude --resume <session> --fork-session`), and a branch of branch 3
//! continues branch 3's own session, not its parent's or a sibling's.

use super::{
    BRANCH_PROMPT, PARENT_PROMPT, PARENT_SAID, all_finished, assert_child,
    assert_children_pay_their_own_calls, assert_ledger_holds, branch, calls_on, continued_branch,
    launch_branchable, texts,
};
use crate::agent_cli::{forks::notes_repo, model_mesh::price_per_call};
use forkyard_proto::{common::v1::ForkStatus, gateway::v1::RunState};
use forkyard_tests::{
    Mesh,
    scripted_model::{Recorded, ScriptedModel},
    support::{Gateway, fork_result, wait_finished},
};
use serde_json::Value;
use std::{collections::HashSet, time::Duration};

const MESSAGES: &str = "/v1/messages";

pub async fn tree(mesh: &Mesh, model: &ScriptedModel) {
    let dir = tempfile::tempdir().unwrap();
    let repo_dir = notes_repo(dir.path());
    let mut gw = Gateway::new(mesh.channel("gateway").await.unwrap());
    let run_id = launch_branchable(&mut gw, &repo_dir, "claude-code", "sonnet").await;
    let run = all_finished(&mut gw, &run_id, 1).await;
    assert_eq!(
        run.forks[0].status,
        ForkStatus::Succeeded as i32,
        "{run:#?}"
    );
    let parent = fork_result(&mut gw, &run_id, 1).await;
    assert!(!parent.agent_session.is_empty(), "no session: {parent:#?}");
    let parent_calls = calls_on(model, MESSAGES).len();

    let made = branch(&mut gw, &run_id, 1, 3, BRANCH_PROMPT).await;
    assert_eq!(made, vec![2, 3, 4]);
    all_finished(&mut gw, &run_id, 4).await;
    let mut children = Vec::new();
    for n in 2..=4 {
        let child = fork_result(&mut gw, &run_id, n).await;
        assert_child(&child, n, &parent);
        children.push(child);
    }
    let sessions: HashSet<_> = children.iter().map(|c| &c.agent_session).collect();
    assert_eq!(sessions.len(), 3, "each branch has a session of its own");
    let calls = calls_on(model, MESSAGES);
    assert_first_requests_continue_the_parent(&calls[parent_calls..]);
    assert_children_pay_their_own_calls(
        (parent_calls, calls.len() - parent_calls),
        price_per_call(3.0, 15.0, 0.3),
        &parent,
        &children,
    );

    let grandchild = continued_branch(&mut gw, &run_id, (model, MESSAGES), &children[1], 5).await;
    let run = wait_finished(&mut gw, &run_id, Duration::from_secs(120)).await;
    assert_eq!(run.state, RunState::Completed as i32, "{run:#?}");
    let tree: Vec<_> = children.into_iter().chain([parent, grandchild]).collect();
    assert_ledger_holds(mesh, &run_id, &tree).await;
}

/// Each branch's first model request: the parent's prompt, its tool call and the tool's
/// result, then the branch's prompt as the last user turn.
fn assert_first_requests_continue_the_parent(calls: &[Recorded]) {
    let firsts: Vec<&Vec<Value>> = calls
        .iter()
        .filter_map(|c| c.body["messages"].as_array())
        .filter(|ms| {
            ms.last()
                .is_some_and(|m| m["role"] == "user" && texts(m).iter().any(|t| t == BRANCH_PROMPT))
        })
        .collect();
    assert_eq!(
        firsts.len(),
        3,
        "one first request per branch of {} calls",
        calls.len()
    );
    for ms in firsts {
        let before = &ms[..ms.len() - 1];
        let said = |m: &&Value| m.to_string().contains(PARENT_PROMPT);
        assert!(
            before.iter().any(|m| m["role"] == "user" && said(&m)),
            "{ms:#?}"
        );
        let tool_use = before
            .iter()
            .any(|m| m["role"] == "assistant" && m["content"].to_string().contains("\"tool_use\""));
        let result = before.iter().any(|m| {
            m["content"].as_array().is_some_and(|bs| {
                bs.iter().any(|b| {
                    b["type"] == "tool_result" && b["content"].to_string().contains(PARENT_SAID)
                })
            })
        });
        assert!(
            tool_use && result,
            "the parent's turns are missing: {ms:#?}"
        );
    }
}
