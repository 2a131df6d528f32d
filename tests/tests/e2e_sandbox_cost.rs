//! A fork's sandbox is charged to its budget like its model: CPU and memory time priced
//! by the provisioner's table, charged while the agent runs and committed in full with
//! the fork. A fork that only burns CPU is stopped when its budget is spent.

use forkyard_proto::{
    budget::v1::budget_ledger_client::BudgetLedgerClient,
    common::v1::ForkStatus,
    gateway::v1::{LaunchRunRequest, RunState, gateway_client::GatewayClient},
};
use forkyard_tests::{
    Mesh,
    mesh::MeshOptions,
    repo,
    support::{fork_result, launch, run_account, wait_finished},
};
use std::time::Duration;

/// A busy loop of `secs` seconds of one core.
fn burn(secs: u32) -> String {
    format!(
        "end=$(($(date +%s)+{secs})); while [ $(date +%s) -lt $end ]; do :; done; echo burnt >> README.md"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandbox_time_is_charged_with_the_fork_and_a_cpu_burner_is_stopped_at_its_budget() {
    // $0.01 per CPU-second: a second of CPU is 10,000 micro-USD.
    let options = MeshOptions {
        service_env: vec![
            (
                "sandbox-provisioner".into(),
                "FORKYARD_SANDBOX_CPU_SECOND_USD".into(),
                "0.01".into(),
            ),
            (
                "sandbox-provisioner".into(),
                "FORKYARD_SANDBOX_GIB_SECOND_USD".into(),
                "0.001".into(),
            ),
        ],
        ..Default::default()
    };
    let mesh = Mesh::start_with(options).await.expect("mesh");
    let dir = tempfile::tempdir().unwrap();
    repo::create(dir.path()).unwrap();
    let mut gw = GatewayClient::new(mesh.channel("gateway").await.unwrap());
    let mut ledger = BudgetLedgerClient::new(mesh.channel("budget-ledger").await.unwrap());

    // Two to three seconds of a busy loop, with room to spare: charged as it ran,
    // committed in full (at least a second of CPU, whatever else the machine runs).
    let req = LaunchRunRequest {
        request_id: "sandbox-cost".into(),
        ..launch(dir.path(), 1, 1, &burn(3))
    };
    let run_id = gw.launch_run(req).await.unwrap().into_inner().run_id;
    let run = wait_finished(&mut gw, &run_id, Duration::from_secs(60)).await;
    assert_eq!(run.state, RunState::Completed as i32, "{run:#?}");
    let fork = fork_result(&mut gw, &run_id, 1).await;
    assert_eq!(fork.status, ForkStatus::Succeeded as i32, "{fork:#?}");
    assert!(fork.sandbox_cost_micros >= 10_000, "{fork:#?}");
    assert_eq!(
        fork.model_cost_micros, 0,
        "the command reported no model use"
    );
    assert_eq!(fork.cost_micros, fork.sandbox_cost_micros);
    let account = run_account(&mut ledger, &run_id).await;
    assert_eq!(
        account.spent_micros, fork.cost_micros,
        "the ledger holds the sandbox's cost"
    );
    assert_eq!(account.reserved_micros, 0);

    // A fork that would burn a minute of CPU on a $0.04 budget: stopped at about four.
    let req = LaunchRunRequest {
        request_id: "cpu-burner".into(),
        budget_usd: "0.04".into(),
        ..launch(dir.path(), 1, 1, &burn(60))
    };
    let started = std::time::Instant::now();
    let run_id = gw.launch_run(req).await.unwrap().into_inner().run_id;
    let run = wait_finished(&mut gw, &run_id, Duration::from_secs(60)).await;
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "ran on: {run:#?}"
    );
    let fork = fork_result(&mut gw, &run_id, 1).await;
    assert_eq!(fork.status, ForkStatus::BudgetExceeded as i32, "{fork:#?}");
    assert!(fork.error.contains("sandbox time"), "{}", fork.error);
    let account = run_account(&mut ledger, &run_id).await;
    assert!(
        account.spent_micros > 0 && account.spent_micros <= 40_000,
        "{account:?}"
    );
    assert_eq!(account.reserved_micros, 0);
    assert_eq!(fork.cost_micros, account.spent_micros);
}
