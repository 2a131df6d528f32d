//! The codex tree: a fork edits notes.txt, two branches of it continue its thread
//! (`codex exec fork <session> <prompt>`, its home travelling in the snapshot's .git):
//! their first Responses request carries the parent's items, its tool call and output
//! among them, then the new prompt.

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
use std::time::Duration;

const RESPONSES: &str = "/v1/responses";

pub async fn tree(mesh: &Mesh, model: &ScriptedModel) {
    let dir = tempfile::tempdir().unwrap();
    let repo_dir = notes_repo(dir.path());
    let mut gw = Gateway::new(mesh.channel("gateway").await.unwrap());
    let run_id = launch_branchable(&mut gw, &repo_dir, "codex", "gpt-5").await;
    let run = all_finished(&mut gw, &run_id, 1).await;
    assert_eq!(
        run.forks[0].status,
        ForkStatus::Succeeded as i32,
        "{run:#?}"
    );
    let parent = fork_result(&mut gw, &run_id, 1).await;
    assert!(
        !parent.agent_session.is_empty(),
        "no thread id: {parent:#?}"
    );
    assert!(parent.patch.contains("+parent edit"), "{}", parent.patch);
    let parent_calls = calls_on(model, RESPONSES).len();

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
    assert_ne!(children[0].agent_session, children[1].agent_session);
    let calls = calls_on(model, RESPONSES);
    assert_first_requests_continue_the_parent(&calls[parent_calls..]);
    assert_children_pay_their_own_calls(
        (parent_calls, calls.len() - parent_calls),
        price_per_call(1.25, 10.0, 0.125),
        &parent,
        &children,
    );

    let grandchild = continued_branch(&mut gw, &run_id, (model, RESPONSES), &children[1], 4).await;
    let run = wait_finished(&mut gw, &run_id, Duration::from_secs(120)).await;
    assert_eq!(run.state, RunState::Completed as i32, "{run:#?}");
    let tree: Vec<_> = children.into_iter().chain([parent, grandchild]).collect();
    assert_ledger_holds(mesh, &run_id, &tree).await;
}

/// Each branch's first request ends with the branch's prompt, after the parent's items:
/// its prompt, its `exec_command` call and that call's output.
fn assert_first_requests_continue_the_parent(calls: &[Recorded]) {
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
