//! What the fork-tree tests with the real CLIs share: the scripted model's script (the
//! parent's edit, then follow-ups answered only with the parent's turns in the
//! request), a branchable launch, branching and waiting, and the checks of what each
//! fork paid.

pub mod builtin;
pub mod claude;
pub mod codex;
pub mod running;

use crate::agent_cli::{forks::notes_repo, model_mesh::launch};
use forkyard_proto::{
    budget::v1::budget_ledger_client::BudgetLedgerClient,
    common::v1::{ForkResult, ForkStatus},
    gateway::v1::{BranchForkRequest, LaunchRunRequest, Run, RunState},
};
use forkyard_tests::{
    Mesh,
    scripted_model::{Followup, OUTPUT_TOKENS, Recorded, Script, ScriptedModel},
    support::{Gateway, fork_result, run_account, wait_finished, wait_until},
};
use serde_json::Value;
use std::{path::Path, time::Duration};

/// What the parent's tool call prints: its tool result, which a branch's requests must
/// carry (the scripted model refuses a follow-up without it).
pub const PARENT_SAID: &str = "parent-tool-said-7f3a";
/// The branches' instruction.
pub const BRANCH_PROMPT: &str = "Now add a line of your own to notes.txt";
/// The instruction that continues branch 3 (a branch of a branch).
pub const CONTINUE_PROMPT: &str = "Now say that you continued";
/// The parent's instruction (`launch`'s).
pub const PARENT_PROMPT: &str = "Add a line to notes.txt";

pub fn script() -> Script {
    let followup = |prompt: &str, command: &str, earlier: &str| Followup {
        prompt: prompt.into(),
        command: command.into(),
        earlier: earlier.into(),
    };
    Script {
        followups: vec![
            followup(
                BRANCH_PROMPT,
                r#"printf 'branch %s\n' "$FORKYARD_FORK" >> notes.txt; echo "branch-said-$FORKYARD_FORK""#,
                PARENT_SAID,
            ),
            // Only fork 3's own turn will do: its session, not a sibling's.
            followup(
                CONTINUE_PROMPT,
                r#"printf 'continued %s\n' "$FORKYARD_FORK" >> notes.txt"#,
                "branch-said-3",
            ),
        ],
        ..Script::edit(&format!(
            "printf 'parent edit\\n' >> notes.txt; echo {PARENT_SAID}"
        ))
    }
}

/// One fork of `driver` on `model`, in a run open for branches; its run id.
pub async fn launch_branchable(gw: &mut Gateway, repo: &Path, driver: &str, model: &str) -> String {
    gw.launch_run(LaunchRunRequest {
        request_id: format!("{driver}-branch-e2e"),
        branch_window_secs: 15,
        fork_budget_usd: "0.2".into(),
        ..launch(repo, driver, model, 1, "1")
    })
    .await
    .expect("launch")
    .into_inner()
    .run_id
}

pub async fn branch(
    gw: &mut Gateway,
    run_id: &str,
    fork: u32,
    count: u32,
    prompt: &str,
) -> Vec<u32> {
    let req = BranchForkRequest {
        run_id: run_id.into(),
        fork,
        count,
        prompt: prompt.into(),
    };
    let made = gw.branch_fork(req).await.expect("branch");
    made.into_inner().forks
}

/// The run back in its branch window with `forks` forks, all finished.
pub async fn all_finished(gw: &mut Gateway, run_id: &str, forks: usize) -> Run {
    wait_until(gw, run_id, Duration::from_secs(300), |r| {
        let open = [ForkStatus::Pending as i32, ForkStatus::Running as i32];
        r.forks.len() == forks
            && r.forks.iter().all(|f| !open.contains(&f.status))
            && r.branchable_until_unix_ms > 0
    })
    .await
}

/// The model calls on one API (`/v1/messages`: Claude Code's, `/v1/responses`: Codex's),
/// so that the two CLIs' runs can share the scripted model at once.
pub fn calls_on(model: &ScriptedModel, path: &str) -> Vec<Recorded> {
    model
        .model_calls()
        .into_iter()
        .filter(|c| c.path == path)
        .collect()
}

/// The text blocks of a message (a string content is one).
pub fn texts(m: &Value) -> Vec<String> {
    match &m["content"] {
        Value::String(s) => vec![s.clone()],
        Value::Array(bs) => bs
            .iter()
            .filter_map(|b| b["text"].as_str().map(str::to_owned))
            .collect(),
        _ => vec![],
    }
}

/// The run's account spent exactly what its forks cost, and holds nothing more.
pub async fn assert_ledger_holds(mesh: &Mesh, run_id: &str, forks: &[ForkResult]) {
    let mut ledger = BudgetLedgerClient::new(mesh.channel("budget-ledger").await.unwrap());
    let account = run_account(&mut ledger, run_id).await;
    let total: i64 = forks.iter().map(|f| f.cost_micros).sum();
    assert_eq!(
        account.spent_micros, total,
        "the ledger holds the tree's costs"
    );
    assert_eq!(account.reserved_micros, 0);
}

/// The calls after the branch point are the children's and theirs only: each child paid
/// exactly its calls (`per_call` each), as many as the parent made for its own turn, and
/// the parent's calls before the branch were not charged again.
pub fn assert_children_pay_their_own_calls(
    (before, after): (usize, usize),
    per_call: i64,
    parent: &ForkResult,
    children: &[ForkResult],
) {
    let calls_of = |f: &ForkResult| f.usage.unwrap_or_default().output_tokens / OUTPUT_TOKENS;
    assert_eq!(
        calls_of(parent) as usize,
        before,
        "the parent's calls, metered once"
    );
    assert_eq!(parent.model_cost_micros, before as i64 * per_call);
    assert_eq!(
        children.iter().map(calls_of).sum::<u64>() as usize,
        after,
        "every call after the branch point was a child's, metered once"
    );
    for c in children {
        assert_eq!(calls_of(c), calls_of(parent), "fork {}: {c:#?}", c.fork);
        assert_eq!(
            c.model_cost_micros, parent.model_cost_micros,
            "fork {}",
            c.fork
        );
        assert_eq!(c.cost_micros, c.model_cost_micros + c.sandbox_cost_micros);
    }
}

/// Branch `n` of fork 1 succeeded with the parent's edit and its own in its patch (and
/// no other branch's), under a session of its own, and with no CLI home in the patch.
pub fn assert_child(f: &ForkResult, n: u32, parent: &ForkResult) {
    assert_eq!(f.status, ForkStatus::Succeeded as i32, "fork {n}: {f:#?}");
    assert_eq!((f.parent_fork, f.depth), (1, 1), "fork {n}");
    assert!(f.patch.contains("+parent edit"), "fork {n}:\n{}", f.patch);
    let own = format!("+branch {n}");
    assert!(f.patch.contains(&own), "fork {n}:\n{}", f.patch);
    assert_eq!(
        f.patch.matches("+branch").count(),
        1,
        "fork {n}:\n{}",
        f.patch
    );
    // The CLIs' homes are in .git: never in a patch.
    for home in [".claude", ".codex", "forkyard/"] {
        assert!(!f.patch.contains(home), "fork {n}:\n{}", f.patch);
    }
    assert!(!f.agent_session.is_empty(), "fork {n}: no session");
    assert_ne!(
        f.agent_session, parent.agent_session,
        "fork {n}: a session of its own"
    );
}

/// Branch 3 continued with a new instruction: fork `next` resumes fork 3's own session
/// (the scripted model wants fork 3's tool result), so its patch holds the parent's edit,
/// fork 3's and its own, and none of fork 3's siblings'. Its first request on `path`
/// carries the parent's turns, fork 3's, then the new instruction.
pub async fn continued_branch(
    gw: &mut Gateway,
    run_id: &str,
    (model, path): (&ScriptedModel, &str),
    three: &ForkResult,
    next: u32,
) -> ForkResult {
    let before = calls_on(model, path).len();
    assert_eq!(branch(gw, run_id, 3, 1, CONTINUE_PROMPT).await, vec![next]);
    all_finished(gw, run_id, next as usize).await;
    let f = fork_result(gw, run_id, next).await;
    assert_eq!(f.status, ForkStatus::Succeeded as i32, "{f:#?}");
    assert_eq!((f.parent_fork, f.depth), (3, 2));
    for line in ["+parent edit", "+branch 3", &format!("+continued {next}")] {
        assert!(
            f.patch.contains(line),
            "fork {next} lacks {line:?}:\n{}",
            f.patch
        );
    }
    assert_eq!(f.patch.matches("+branch").count(), 1, "{}", f.patch);
    assert_ne!(f.agent_session, three.agent_session);
    let calls = calls_on(model, path);
    let body = &calls[before].body;
    let first = if body["input"].is_array() {
        &body["input"]
    } else {
        &body["messages"]
    };
    let text = first.to_string();
    assert!(
        text.contains(PARENT_SAID) && text.contains(BRANCH_PROMPT),
        "{first:#}"
    );
    let last = first.as_array().and_then(|ms| ms.last()).expect("messages");
    assert!(texts(last).iter().any(|t| t == CONTINUE_PROMPT), "{last:#}");
    f
}

/// A tree of `driver` on `model_name`, whose calls go to `path`, each costing
/// `per_call`: a fork, two branches of it (each with a session of its own, its first
/// request checked by `first_requests`, paying only its own calls), a branch of the
/// second, and the ledger holding the tree.
pub async fn two_branches(
    mesh: &Mesh,
    model: &ScriptedModel,
    (driver, model_name): (&str, &str),
    path: &str,
    per_call: i64,
    first_requests: fn(&str, &[Recorded]),
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
    assert_ne!(children[0].agent_session, children[1].agent_session);
    let calls = calls_on(model, path);
    first_requests(driver, &calls[parent_calls..]);
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
