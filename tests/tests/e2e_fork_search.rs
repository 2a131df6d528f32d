//! A search over trajectories (#45), end to end on the real mesh with the `command`
//! driver: 2 rounds of 4 forks, keep 2, branch 2, whose verify passes only in round 2.
//! The two cheapest forks of round 1 are each branched twice from their end (their edit
//! is in the branches' patches), with the follow-up prompt quoting their failed verify;
//! round 2 verifies, a round-2 fork wins over the whole tree, the ledger charged each
//! fork once, and nothing of the run is left. BranchFork on a run without a branch window
//! is refused with the reason.

use forkyard_proto::{
    budget::v1::budget_ledger_client::BudgetLedgerClient,
    common::v1::{ForkStatus, VerifyStatus},
    gateway::v1::{BranchForkRequest, LaunchRunRequest, RunState, Search},
    sandbox::v1::sandbox_provisioner_client::SandboxProvisionerClient,
};
use forkyard_tests::{
    Mesh, repo,
    support::{
        Gateway, assert_no_sandbox_or_snapshot, fork_result, launch, run_account, wait_finished,
    },
};
use std::time::Duration;

/// Round 1 (no parent) writes its attempt and costs $0.0n for fork n, so forks 1 and 2
/// are the cheapest; a branch checks its parent's attempt is in its workspace, writes the
/// prompt it was given (the follow-up) and costs $0.001.
const AGENT: &str = r#"if [ -z "$FORKYARD_PARENT_FORK" ]; then
  echo "attempt of fork $FORKYARD_FORK" > attempt.txt
  cost=0.0$FORKYARD_FORK
else
  grep -q "attempt of fork $FORKYARD_PARENT_FORK" attempt.txt || { echo "no parent attempt" >&2; exit 7; }
  printf '%s\n' "$FORKYARD_PROMPT" > followup.txt
  cost=0.001
fi
printf '{"type":"result","total_cost_usd":%s,"usage":{"input_tokens":10,"output_tokens":2}}\n' "$cost""#;

/// Fails (exit 3, saying so) until a follow-up naming its round is there: only round 2
/// passes.
const VERIFY: &str = r#"if [ -s followup.txt ]; then grep -q '^Round 2 from fork' followup.txt; else echo 'tests failed: no followup.txt'; exit 3; fi"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_two_round_search_branches_the_best_of_round_one_and_verifies_in_round_two() {
    let mesh = Mesh::start().await.expect("mesh starts");
    let src = tempfile::tempdir().unwrap();
    let base = repo::create(src.path()).unwrap();
    let mut gw = Gateway::new(mesh.channel("gateway").await.unwrap());
    let prov = SandboxProvisionerClient::new(mesh.channel("sandbox-provisioner").await.unwrap());
    let run_id = gw
        .launch_run(LaunchRunRequest {
            verify_command: VERIFY.into(),
            search: Some(Search {
                rounds: 2,
                keep: 2,
                branches: 2,
                follow_up: "Round {round} from fork {fork} (exit {verify_exit_code}): \
                            {verify_output}"
                    .into(),
            }),
            ..launch(src.path(), 4, 4, AGENT)
        })
        .await
        .expect("launch")
        .into_inner()
        .run_id;
    // A search branches by itself: without a branch window, no one else may.
    let refused = gw
        .branch_fork(BranchForkRequest {
            run_id: run_id.clone(),
            fork: 1,
            count: 1,
            prompt: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(
        refused.code(),
        tonic::Code::FailedPrecondition,
        "{refused:?}"
    );
    assert!(
        refused.message().contains("without branch_window_secs"),
        "{refused:?}"
    );
    let run = wait_finished(&mut gw, &run_id, Duration::from_secs(240)).await;
    assert_eq!(run.state, RunState::Completed as i32, "{run:#?}");
    assert_eq!(run.forks.len(), 8, "4 forks and 2 x 2 branches: {run:#?}");
    assert_eq!((run.search_round, run.search_end.as_str()), (2, ""));
    for f in &run.forks[..4] {
        assert_eq!(
            f.status,
            ForkStatus::Succeeded as i32,
            "fork {}: {}",
            f.fork,
            f.error
        );
        assert_eq!(
            f.verify,
            VerifyStatus::Failed as i32,
            "fork {} verified",
            f.fork
        );
    }
    // The two cheapest of round 1, twice each, in ranking order.
    let lineage: Vec<(u32, u32)> = run.forks[4..]
        .iter()
        .map(|f| (f.parent_fork, f.depth))
        .collect();
    assert_eq!(lineage, [(1, 1), (1, 1), (2, 1), (2, 1)], "{run:#?}");
    for f in &run.forks[4..] {
        assert_eq!(
            f.verify,
            VerifyStatus::Passed as i32,
            "fork {}: {f:#?}",
            f.fork
        );
        let full = fork_result(&mut gw, &run_id, f.fork).await;
        assert_eq!(
            full.base_commit, base,
            "a branch's patch is against the run's base"
        );
        let parent_edit = format!("+attempt of fork {}", f.parent_fork);
        let follow_up = format!(
            "+Round 2 from fork {} (exit 3): tests failed: no followup.txt",
            f.parent_fork
        );
        for line in [parent_edit, follow_up] {
            assert!(
                full.patch.contains(&line),
                "fork {} lacks {line:?}:\n{}",
                f.fork,
                full.patch
            );
        }
    }
    // Verified round-2 forks first, then round 1 by cost; the winner is a branch.
    assert_eq!(run.ranking, vec![5, 6, 7, 8, 1, 2, 3, 4], "{run:#?}");
    assert_eq!(run.winner, 5);

    let mut ledger = BudgetLedgerClient::new(mesh.channel("budget-ledger").await.unwrap());
    let account = run_account(&mut ledger, &run_id).await;
    assert_eq!(
        account.spent_micros,
        10_000 + 20_000 + 30_000 + 40_000 + 4 * 1_000,
        "each fork charged once"
    );
    assert_eq!(run.cost_micros, account.spent_micros);
    assert_eq!(account.reserved_micros, 0);
    assert_no_sandbox_or_snapshot(&mesh, &prov, &run_id).await;
}
