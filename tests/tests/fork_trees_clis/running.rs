//! A running fork branched at its last completed model turn. For `claude-code` and
//! `codex` the runner holding its agent holds the fork's next model request at its LLM
//! gateway while the workspace (the CLI's home and session inside it) is snapshotted,
//! and lets it go; the built-in `anthropic`/`openai` loops keep their conversation in the workspace
//! and have it snapshotted before they ask their model again. The parent never stops;
//! the branches start from exactly that turn.

use super::{BRANCH_PROMPT, all_finished, assert_ledger_holds, branch, calls_on};
use crate::agent_cli::{forks::notes_repo, model_mesh::launch};
use forkyard_proto::{
    common::v1::{ForkResult, ForkStatus},
    gateway::v1::{LaunchRunRequest, RunState},
    labels,
    sandbox::v1::{
        ListSandboxesRequest, ListSnapshotsRequest,
        sandbox_provisioner_client::SandboxProvisionerClient,
    },
};
use forkyard_tests::{
    Mesh,
    scripted_model::{Followup, OUTPUT_TOKENS, Script, ScriptedModel},
    support::{Gateway, fork_result, wait_finished},
};
use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

/// The parent's tool calls before it is done.
const PARENT_TURNS: usize = 5;

/// The parent counts its turns into turns.txt, one tool call a turn, each printing
/// `ran-turn-<n>`; a slow model (2 s a call) leaves time to branch it while it runs. A branch's follow-up needs the parent's first
/// turn in its conversation.
pub fn script() -> Script {
    Script {
        calls: PARENT_TURNS,
        delay: Duration::from_secs(2),
        followups: vec![Followup {
            prompt: BRANCH_PROMPT.into(),
            command: r#"printf 'branch %s\n' "$FORKYARD_FORK" >> notes.txt; echo "branch-said-$FORKYARD_FORK""#.into(),
            earlier: "ran-turn-1".into(),
        }],
        ..Script::edit(
            r#"touch turns.txt; n=$(( $(wc -l < turns.txt) + 1 )); echo "turn $n" >> turns.txt; echo "ran-turn-$n""#,
        )
    }
}

/// A fork of `driver` on `model_name`, whose model calls go to `path` at `per_call`
/// each, branched into two two turns in.
pub async fn branch_mid_run(
    mesh: &Mesh,
    model: &ScriptedModel,
    (driver, model_name): (&str, &str),
    path: &str,
    per_call: i64,
) {
    let dir = tempfile::tempdir().unwrap();
    let repo_dir = notes_repo(dir.path());
    let mut gw = Gateway::new(mesh.channel("gateway").await.unwrap());
    let prov = SandboxProvisionerClient::new(mesh.channel("sandbox-provisioner").await.unwrap());
    let run_id = gw
        .launch_run(LaunchRunRequest {
            branch_window_secs: 10,
            fork_budget_usd: "0.2".into(),
            max_concurrent: 3,
            request_id: format!("{driver}-running-branch"),
            ..launch(&repo_dir, driver, model_name, 1, "1")
        })
        .await
        .expect("launch")
        .into_inner()
        .run_id;
    // Two turns in: the parent's second tool call has run or is running.
    wait_for_calls(model, path, 2).await;
    let made = branch(&mut gw, &run_id, 1, 2, BRANCH_PROMPT).await;
    assert_eq!(made, vec![2, 3]);
    let parent_calls_at_branch = calls_on(model, path)
        .iter()
        .filter(|c| !c.body.to_string().contains(BRANCH_PROMPT))
        .count();

    let run = all_finished(&mut gw, &run_id, 3).await;
    let parent = fork_result(&mut gw, &run_id, 1).await;
    assert_eq!(
        parent.status,
        ForkStatus::Succeeded as i32,
        "{driver}: {parent:#?}"
    );
    // The parent went on to its end, its held request answered like any other.
    assert_eq!(turns_in(&parent), PARENT_TURNS, "{}", parent.patch);
    assert_eq!(calls_of(&parent), PARENT_TURNS + 1);
    let point = run.forks[1].branch_turn;
    assert!(
        point >= 2 && (point as usize) < PARENT_TURNS && point as usize <= parent_calls_at_branch,
        "{driver}: branched at turn {point} (the parent had made {parent_calls_at_branch} calls when it returned)"
    );
    for n in [2, 3] {
        let child = fork_result(&mut gw, &run_id, n).await;
        assert_eq!(
            child.status,
            ForkStatus::Succeeded as i32,
            "fork {n}: {child:#?}"
        );
        assert_eq!(
            (child.parent_fork, child.depth, child.branch_turn),
            (1, 1, point)
        );
        // The workspace as it was at the turn: its turns, none of the parent's later ones.
        assert_eq!(
            turns_in(&child),
            point as usize,
            "fork {n}:\n{}",
            child.patch
        );
        assert!(
            child.patch.contains(&format!("+branch {n}")),
            "{}",
            child.patch
        );
        assert_eq!(child.patch.matches("+branch").count(), 1, "{}", child.patch);
        assert!(!child.agent_session.is_empty() && child.agent_session != parent.agent_session);
        // Its follow-up call and its "done": its own, nothing of the parent's.
        assert_eq!(calls_of(&child), 2, "fork {n}: {child:#?}");
        assert_eq!(child.model_cost_micros, 2 * per_call);
    }
    assert_first_requests_hold_the_turns(model, path, point as usize);
    assert_eq!(
        parent.model_cost_micros,
        (PARENT_TURNS as i64 + 1) * per_call
    );

    let run = wait_finished(&mut gw, &run_id, Duration::from_secs(120)).await;
    assert_eq!(run.state, RunState::Completed as i32, "{run:#?}");
    let tree: Vec<ForkResult> = run.forks.clone();
    assert_ledger_holds(mesh, &run_id, &tree).await;
    // The point's snapshot went with the run, as the forks' ends did (by the run's
    // labels: another tree may be running on the same mesh).
    let by_run = HashMap::from([(labels::RUN_ID.to_owned(), run_id.clone())]);
    let snapshots = prov
        .clone()
        .list_snapshots(ListSnapshotsRequest {
            labels: by_run.clone(),
        })
        .await
        .unwrap()
        .into_inner()
        .snapshots;
    assert!(
        snapshots.is_empty(),
        "{driver}: snapshots left: {snapshots:?}"
    );
    let sandboxes = prov
        .clone()
        .list_sandboxes(ListSandboxesRequest {
            label_selector: by_run,
        })
        .await
        .unwrap()
        .into_inner()
        .sandboxes;
    assert!(
        sandboxes.is_empty(),
        "{driver}: sandboxes left: {sandboxes:?}"
    );
}

async fn wait_for_calls(model: &ScriptedModel, path: &str, n: usize) {
    let since = Instant::now();
    while calls_on(model, path).len() < n {
        assert!(
            since.elapsed() < Duration::from_secs(120),
            "the parent made {} model calls on {path}",
            calls_on(model, path).len()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The turns a fork's patch counts in turns.txt.
fn turns_in(f: &ForkResult) -> usize {
    f.patch.lines().filter(|l| l.starts_with("+turn ")).count()
}

fn calls_of(f: &ForkResult) -> usize {
    (f.usage.unwrap_or_default().output_tokens / OUTPUT_TOKENS) as usize
}

/// Each branch's first request: the parent's tool results up to the point, none after,
/// and the branch's prompt last.
fn assert_first_requests_hold_the_turns(model: &ScriptedModel, path: &str, point: usize) {
    let firsts: Vec<String> = calls_on(model, path)
        .iter()
        .map(|c| {
            let input = &c.body["input"];
            if input.is_array() {
                input
            } else {
                &c.body["messages"]
            }
            .to_string()
        })
        .filter(|ms| ms.contains(BRANCH_PROMPT) && !ms.contains("branch-said-"))
        .collect();
    assert_eq!(firsts.len(), 2, "one first request per branch");
    for ms in firsts {
        for t in 1..=point {
            assert!(
                ms.contains(&format!("ran-turn-{t}")),
                "turn {t} missing: {ms}"
            );
        }
        assert!(
            !ms.contains(&format!("ran-turn-{}", point + 1)),
            "a turn after the point: {ms}"
        );
    }
}
