//! Fork trees (#45) with the real `claude` CLI through the whole mesh: a claude-code
//! fork edits notes.txt (the scripted model's tool call); branching it into three with a
//! new prompt gives three forks whose Claude Code resumes the parent's session (its home
//! travels with the workspace's snapshot): their first model request carries the
//! parent's turns, the parent's tool result among them, then the new prompt as the last
//! user turn. Each child's patch holds the parent's edit and its own, and each is charged
//! for its own model calls only, as the parent was for its. Continuing one of them (a
//! branch of a branch) resumes that child's own session, not its parent's or a sibling's.
//!
//! `make test` installs the CLI (pinned, from npm); without it this test fails.

mod agent_cli;

use agent_cli::{
    forks::notes_repo,
    model_mesh::{assert_cli_installed, launch, options, price_per_call},
};
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
use std::{collections::HashSet, time::Duration};

/// What the parent's tool call prints: its tool result, which a branch's requests must
/// carry (the scripted model refuses a follow-up without it).
const PARENT_SAID: &str = "parent-tool-said-7f3a";
/// The branches' instruction.
const BRANCH_PROMPT: &str = "Now add a line of your own to notes.txt";
/// The instruction that continues branch 3 (a branch of a branch).
const CONTINUE_PROMPT: &str = "Now say that you continued";

fn script() -> Script {
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

async fn branch(gw: &mut Gateway, run_id: &str, fork: u32, count: u32, prompt: &str) -> Vec<u32> {
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
async fn all_finished(gw: &mut Gateway, run_id: &str, forks: usize) -> Run {
    wait_until(gw, run_id, Duration::from_secs(300), |r| {
        let open = [ForkStatus::Pending as i32, ForkStatus::Running as i32];
        r.forks.len() == forks
            && r.forks.iter().all(|f| !open.contains(&f.status))
            && r.branchable_until_unix_ms > 0
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claude_code_fork_branches_into_three_that_continue_its_conversation() {
    assert_cli_installed("claude");
    let model = ScriptedModel::start(script()).await;
    let mesh = Mesh::start_with(options(&model)).await.expect("mesh");
    let dir = tempfile::tempdir().unwrap();
    let repo_dir = notes_repo(dir.path());
    let mut gw = Gateway::new(mesh.channel("gateway").await.unwrap());
    let run_id = gw
        .launch_run(LaunchRunRequest {
            request_id: "claude-branch-e2e".into(),
            branch_window_secs: 15,
            fork_budget_usd: "0.2".into(),
            ..launch(&repo_dir, "claude-code", "sonnet", 1, "1")
        })
        .await
        .expect("launch")
        .into_inner()
        .run_id;
    let run = all_finished(&mut gw, &run_id, 1).await;
    assert_eq!(
        run.forks[0].status,
        ForkStatus::Succeeded as i32,
        "{run:#?}"
    );
    let parent = fork_result(&mut gw, &run_id, 1).await;
    assert!(!parent.agent_session.is_empty(), "no session: {parent:#?}");
    let parent_calls = model.model_calls().len();

    let made = branch(&mut gw, &run_id, 1, 3, BRANCH_PROMPT).await;
    assert_eq!(made, vec![2, 3, 4]);
    all_finished(&mut gw, &run_id, 4).await;
    let mut children = Vec::new();
    for n in 2..=4 {
        children.push(checked_child(&mut gw, &run_id, n, &parent).await);
    }
    let sessions: HashSet<_> = children.iter().map(|c| &c.agent_session).collect();
    assert_eq!(sessions.len(), 3, "each branch has a session of its own");
    let calls = model.model_calls();
    assert_first_requests_continue_the_parent(&calls[parent_calls..]);
    assert_children_pay_their_own_calls(
        (parent_calls, calls.len() - parent_calls),
        &parent,
        &children,
    );

    let grandchild = continued_branch(&mut gw, &run_id, &model, &children[1]).await;
    let run = wait_finished(&mut gw, &run_id, Duration::from_secs(120)).await;
    assert_eq!(run.state, RunState::Completed as i32, "{run:#?}");
    let tree: Vec<_> = children.into_iter().chain([parent, grandchild]).collect();
    assert_ledger_holds(&mesh, &run_id, &tree).await;
}

/// The run's account spent exactly what its forks cost, and holds nothing more.
async fn assert_ledger_holds(mesh: &Mesh, run_id: &str, forks: &[ForkResult]) {
    let mut ledger = BudgetLedgerClient::new(mesh.channel("budget-ledger").await.unwrap());
    let account = run_account(&mut ledger, run_id).await;
    let total: i64 = forks.iter().map(|f| f.cost_micros).sum();
    assert_eq!(
        account.spent_micros, total,
        "the ledger holds the tree's costs"
    );
    assert_eq!(account.reserved_micros, 0);
}

/// Branch 3 continued with a new instruction: fork 5 resumes fork 3's own session (the
/// scripted model wants fork 3's tool result), so its patch holds the parent's edit,
/// fork 3's and its own, and none of fork 3's siblings'.
async fn continued_branch(
    gw: &mut Gateway,
    run_id: &str,
    model: &ScriptedModel,
    three: &ForkResult,
) -> ForkResult {
    let before = model.model_calls().len();
    assert_eq!(branch(gw, run_id, 3, 1, CONTINUE_PROMPT).await, vec![5]);
    all_finished(gw, run_id, 5).await;
    let five = fork_result(gw, run_id, 5).await;
    assert_eq!(five.status, ForkStatus::Succeeded as i32, "{five:#?}");
    assert_eq!((five.parent_fork, five.depth), (3, 2));
    for line in ["+parent edit", "+branch 3", "+continued 5"] {
        assert!(
            five.patch.contains(line),
            "fork 5 lacks {line:?}:\n{}",
            five.patch
        );
    }
    assert_eq!(five.patch.matches("+branch").count(), 1, "{}", five.patch);
    assert_ne!(five.agent_session, three.agent_session);
    // Its first request: the parent's turns, fork 3's, then the new instruction.
    let calls = model.model_calls();
    let first = &calls[before].body["messages"];
    let text = first.to_string();
    assert!(
        text.contains(PARENT_SAID) && text.contains(BRANCH_PROMPT),
        "{first:#}"
    );
    let last = first.as_array().and_then(|ms| ms.last()).expect("messages");
    assert!(texts(last).iter().any(|t| t == CONTINUE_PROMPT), "{last:#}");
    five
}

/// Branch `n` of the parent succeeded with the parent's edit and its own in its patch,
/// under a session of its own.
async fn checked_child(gw: &mut Gateway, run_id: &str, n: u32, parent: &ForkResult) -> ForkResult {
    let f = fork_result(gw, run_id, n).await;
    assert_eq!(f.status, ForkStatus::Succeeded as i32, "fork {n}: {f:#?}");
    assert_eq!((f.parent_fork, f.depth), (1, 1), "fork {n}");
    assert!(f.patch.contains("+parent edit"), "fork {n}:\n{}", f.patch);
    assert!(
        f.patch.contains(&format!("+branch {n}")),
        "fork {n}:\n{}",
        f.patch
    );
    assert_eq!(
        f.patch.matches("+branch").count(),
        1,
        "fork {n}:\n{}",
        f.patch
    );
    // Claude Code's home is in .git: never in a patch.
    assert!(!f.patch.contains(".claude"), "fork {n}:\n{}", f.patch);
    assert!(!f.agent_session.is_empty(), "fork {n}: no session");
    assert_ne!(
        f.agent_session, parent.agent_session,
        "fork {n}: --fork-session"
    );
    f
}

/// The text blocks of a message (a string content is one).
fn texts(m: &Value) -> Vec<String> {
    match &m["content"] {
        Value::String(s) => vec![s.clone()],
        Value::Array(bs) => bs
            .iter()
            .filter_map(|b| b["text"].as_str().map(str::to_owned))
            .collect(),
        _ => vec![],
    }
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
        let said = |m: &&Value| m.to_string().contains("Add a line to notes.txt");
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

/// The calls after the branch point are the children's and theirs only: each child paid
/// exactly its calls, as many as the parent made for its own turn, and the parent's
/// calls before the branch were not charged again.
fn assert_children_pay_their_own_calls(
    (before, after): (usize, usize),
    parent: &ForkResult,
    children: &[ForkResult],
) {
    let per_call = price_per_call(3.0, 15.0, 0.3);
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
