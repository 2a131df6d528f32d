//! The run's ledger account is opened by its first wave, beside the wave's sandbox
//! creates. A ledger away for a few seconds at launch only delays the run; a ledger away
//! past the open's retries fails the run naming the step, with every sandbox the wave
//! made destroyed and nothing reserved.

use forkyard_proto::{
    budget::v1::budget_ledger_client::BudgetLedgerClient,
    common::v1::ForkStatus,
    gateway::v1::{LaunchRunRequest, RunState},
};
use forkyard_tests::{
    Mesh, repo,
    support::{
        Gateway, launch, left_after_settling, run_account, sandbox_processes, wait_finished,
        wait_until, workspaces_left,
    },
};
use std::time::Duration;

const AGENT: &str = r#"echo "fork $FORKYARD_FORK" > "fork-$FORKYARD_FORK.txt"
printf '{"type":"result","total_cost_usd":0.001,"usage":{"input_tokens":10,"output_tokens":2}}\n'"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ledger_back_within_the_opens_retries_delays_the_run_and_loses_nothing() {
    let mut mesh = Mesh::start().await.expect("mesh starts");
    let src = tempfile::tempdir().unwrap();
    repo::create(src.path()).unwrap();
    let mut gw = Gateway::new(mesh.channel("gateway").await.unwrap());

    mesh.kill9("budget-ledger");
    let run_id = gw
        .launch_run(LaunchRunRequest {
            request_id: "ledger-back-soon".into(),
            ..launch(src.path(), 3, 3, AGENT)
        })
        .await
        .unwrap()
        .into_inner()
        .run_id;
    // The first wave is under way (its open of the account fails: nothing listens)
    // before the ledger is back.
    wait_until(&mut gw, &run_id, Duration::from_secs(60), |r| {
        r.forks.iter().any(|f| f.phase == "creating sandbox")
    })
    .await;
    mesh.start_service("budget-ledger").unwrap();
    mesh.wait_serving("budget-ledger", Duration::from_secs(30))
        .await
        .unwrap();

    let run = wait_finished(&mut gw, &run_id, Duration::from_secs(120)).await;
    assert_eq!(run.state, RunState::Completed as i32, "{run:#?}");
    assert_eq!(run.forks_succeeded, 3, "{run:#?}");
    let mut ledger = BudgetLedgerClient::new(mesh.channel("budget-ledger").await.unwrap());
    let account = run_account(&mut ledger, &run_id).await;
    assert_eq!(account.spent_micros, run.cost_micros, "{account:#?}");
    assert_eq!(account.spent_micros, 3_000, "{account:#?}");
    assert_eq!(account.reserved_micros, 0, "{account:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ledger_away_past_the_opens_retries_fails_the_run_and_leaves_no_sandbox() {
    let mut mesh = Mesh::start().await.expect("mesh starts");
    let src = tempfile::tempdir().unwrap();
    repo::create(src.path()).unwrap();
    let mut gw = Gateway::new(mesh.channel("gateway").await.unwrap());

    mesh.kill9("budget-ledger");
    let run_id = gw
        .launch_run(LaunchRunRequest {
            request_id: "ledger-away".into(),
            ..launch(src.path(), 3, 3, AGENT)
        })
        .await
        .unwrap()
        .into_inner()
        .run_id;

    let run = wait_finished(&mut gw, &run_id, Duration::from_secs(120)).await;
    assert_eq!(run.state, RunState::Failed as i32, "{run:#?}");
    assert!(run.error.contains("open ledger account"), "{}", run.error);
    for f in &run.forks {
        assert_eq!(f.status, ForkStatus::Failed as i32, "{f:#?}");
        assert!(f.error.contains("open ledger account"), "{}", f.error);
    }
    // The wave made the forks' sandboxes while the open was tried: all destroyed.
    assert!(
        workspaces_left(mesh.state_dir()).is_empty(),
        "{:?}",
        workspaces_left(mesh.state_dir())
    );
    let left = left_after_settling(|| sandbox_processes(mesh.state_dir())).await;
    assert!(left.is_empty(), "{left:#?}");
}
