//! The gateway killed at each step boundary of a fork's finish (after its patch is
//! collected, after its spend is committed, after its sandbox is destroyed), at the
//! exact moment, through a fault point (`forkyard_common::fault`, debug builds). The
//! retry of the finish on a new gateway must return what the first attempt reached:
//! every fork SUCCEEDED with its patch, started once, its cost the ledger's to the
//! micro-dollar, the agents' share exactly what they reported.
//!
//! Before the patch was recorded under an idempotency key, a kill after the destroy
//! lost the patch (the fork was started again on a new sandbox and charged twice), and
//! a kill after the commit made the retry compute a different sandbox cost, which the
//! ledger refused as the same key with another amount.

use forkyard_proto::{
    budget::v1::budget_ledger_client::BudgetLedgerClient,
    common::v1::ForkStatus,
    gateway::v1::{LaunchRunRequest, RunState},
};
use forkyard_tests::{
    Mesh,
    mesh::MeshOptions,
    repo,
    support::{Gateway, fork_result, launch, run_account, wait_finished},
};
use std::time::Duration;

/// Each fork's agent reports $0.01: 10,000 µ$, the part of its cost known in advance.
const AGENT: &str = r#"echo "fork $FORKYARD_FORK" > done.txt; printf '{"total_cost_usd": 0.01}\n'"#;
const FORKS: u32 = 2;

async fn killed_at(point: &str) {
    let mut mesh = Mesh::start_with(MeshOptions {
        // Sandbox time is priced, so a second patch collection would cost more than
        // the first: what the ledger took must be what the first attempt computed.
        env: vec![("FORKYARD_SANDBOX_CPU_SECOND_USD".into(), "0.5".into())],
        service_env: vec![("gateway".into(), "FORKYARD_FAULTS".into(), point.into())],
        ..Default::default()
    })
    .await
    .expect("mesh starts");
    let src = tempfile::tempdir().unwrap();
    repo::create(src.path()).unwrap();
    let mut gw = Gateway::new(mesh.channel("gateway").await.unwrap());
    let req = LaunchRunRequest {
        request_id: format!("fault-{point}"),
        ..launch(src.path(), FORKS, FORKS, AGENT)
    };
    let run_id = gw.launch_run(req).await.unwrap().into_inner().run_id;

    let died = tokio::task::block_in_place(|| mesh.wait_exit("gateway", Duration::from_secs(120)));
    assert!(
        died.is_some_and(|s| !s.success()),
        "{point}: the gateway did not die there: {died:?}"
    );
    assert!(
        mesh.log_tail("gateway").contains(point),
        "{point}: {}",
        mesh.log_tail("gateway")
    );
    mesh.set_service_env("gateway", "FORKYARD_FAULTS", None);
    mesh.start_service("gateway").unwrap();
    mesh.wait_serving("gateway", Duration::from_secs(60))
        .await
        .unwrap();

    let mut gw = Gateway::new(mesh.channel("gateway").await.unwrap());
    let run = wait_finished(&mut gw, &run_id, Duration::from_secs(240)).await;
    assert_eq!(run.state, RunState::Completed as i32, "{point}: {run:#?}");
    let mut costs = 0;
    for fork in 1..=FORKS {
        let f = fork_result(&mut gw, &run_id, fork).await;
        assert_eq!(f.status, ForkStatus::Succeeded as i32, "{point}: {f:#?}");
        assert!(
            f.patch.contains(&format!("+fork {fork}")),
            "{point}: {}",
            f.patch
        );
        assert_eq!(
            f.model_cost_micros, 10_000,
            "{point}: the agent ran once: {f:#?}"
        );
        assert_eq!(
            f.cost_micros,
            f.model_cost_micros + f.sandbox_cost_micros,
            "{f:#?}"
        );
        costs += f.cost_micros;
    }
    let mut ledger = BudgetLedgerClient::new(mesh.channel("budget-ledger").await.unwrap());
    let account = run_account(&mut ledger, &run_id).await;
    assert_eq!(
        account.spent_micros, costs,
        "{point}: the ledger holds what the forks say"
    );
    assert_eq!(account.reserved_micros, 0, "{point}: {account:#?}");
    assert!(account.spent_micros >= i64::from(FORKS) * 10_000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_killed_after_a_forks_patch_loses_nothing() {
    killed_at("finish.after-patch").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_killed_after_a_forks_commit_loses_nothing() {
    killed_at("finish.after-commit").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_killed_after_a_forks_destroy_loses_nothing() {
    killed_at("finish.after-destroy").await;
}
