//! End to end, a run's budget running out: the run waits (AWAITING_BUDGET) rather than
//! fails, holds no sandbox while it waits, and RaiseBudget lets it finish with the ledger
//! exact.

use forkyard_proto::{
    budget::v1::budget_ledger_client::BudgetLedgerClient,
    common::v1::ForkStatus,
    gateway::v1::{RaiseBudgetRequest, RunState},
    labels,
    sandbox::v1::{ListSandboxesRequest, sandbox_provisioner_client::SandboxProvisionerClient},
};
use forkyard_tests::{
    fixture::{LONG, setup, status_of},
    support::{Gateway, get_run, launch, run_account, wait_finished, wait_until},
};
use std::{collections::HashMap, time::Duration};
use tonic::Code;

/// Launch three forks, `max_concurrent` at a time, with a `budget_usd` budget; each fork
/// may spend $0.03 and spends $0.02. Returns the run id.
async fn launch_three_spending_2_cents(
    gw: &mut Gateway,
    src: &std::path::Path,
    max_concurrent: u32,
    budget_usd: &str,
) -> String {
    let agent = r#"echo x > f.txt; echo '{"total_cost_usd": 0.02}'"#;
    let mut req = launch(src, 3, max_concurrent, agent);
    req.budget_usd = budget_usd.into();
    req.fork_budget_usd = "0.03".into();
    gw.launch_run(req).await.unwrap().into_inner().run_id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spent_budget_waits_for_raise_budget_and_the_ledger_stays_exact() {
    let (mesh, src, mut gw) = setup().await;
    // One fork at a time; $0.05 covers two reservations, not three.
    let run_id = launch_three_spending_2_cents(&mut gw, src.path(), 1, "0.05").await;

    let waiting = wait_until(&mut gw, &run_id, LONG, |r| {
        r.state == RunState::AwaitingBudget as i32
    })
    .await;
    assert_eq!(waiting.forks_succeeded, 2, "{waiting:#?}");
    assert_eq!(status_of(&waiting, 3), ForkStatus::Pending);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        get_run(&mut gw, &run_id).await.state,
        RunState::AwaitingBudget as i32,
        "it waits, not fails"
    );

    let raise = |amount: &str| RaiseBudgetRequest {
        run_id: run_id.clone(),
        amount_usd: amount.into(),
    };
    for bad in ["-1", "0", "abc", ""] {
        let err = gw.raise_budget(raise(bad)).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{bad:?}: {err:?}");
        assert!(err.message().starts_with("amount_usd"), "{}", err.message());
    }
    let raised = gw.raise_budget(raise("0.05")).await.unwrap().into_inner();
    assert_eq!(raised.budget_micros, 100_000);
    let run = wait_finished(&mut gw, &run_id, LONG).await;
    assert_eq!(run.state, RunState::Completed as i32, "{run:#?}");
    assert_eq!(run.forks_succeeded, 3);
    assert_eq!(run.budget_micros, 100_000);

    let mut ledger = BudgetLedgerClient::new(mesh.channel("budget-ledger").await.unwrap());
    let account = run_account(&mut ledger, &run_id).await;
    assert_eq!(account.spent_micros, 60_000);
    assert_eq!(account.spent_micros, run.cost_micros);
    assert_eq!(account.reserved_micros, 0);
    assert_eq!(account.budget_micros, 100_000);
    assert_eq!(
        gw.raise_budget(raise("1")).await.unwrap_err().code(),
        Code::FailedPrecondition,
        "run finished"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wave_with_budget_for_some_of_its_forks_runs_those_and_waits_for_the_rest() {
    let (mesh, src, mut gw) = setup().await;
    // Three forks start as one wave, whose reserves go to the ledger together; $0.06
    // covers two reservations at once, and after they spent $0.04 what is left does not
    // cover the third.
    let run_id = launch_three_spending_2_cents(&mut gw, src.path(), 3, "0.06").await;

    let waiting = wait_until(&mut gw, &run_id, LONG, |r| {
        r.state == RunState::AwaitingBudget as i32 && r.forks_succeeded == 2
    })
    .await;
    assert_eq!(waiting.forks_succeeded, 2, "{waiting:#?}");
    let pending: Vec<u32> = waiting
        .forks
        .iter()
        .filter(|f| f.status == ForkStatus::Pending as i32)
        .map(|f| f.fork)
        .collect();
    assert_eq!(pending.len(), 1, "the refused fork waits: {waiting:#?}");
    // Its sandbox, made while its reserve was on the way, was destroyed at the refusal:
    // a waiting fork holds nothing (the two finished forks destroyed theirs).
    let mut prov =
        SandboxProvisionerClient::new(mesh.channel("sandbox-provisioner").await.unwrap());
    let alive = prov
        .list_sandboxes(ListSandboxesRequest {
            label_selector: HashMap::from([(labels::RUN_ID.to_owned(), run_id.clone())]),
        })
        .await
        .unwrap()
        .into_inner()
        .sandboxes;
    assert!(alive.is_empty(), "sandboxes left while waiting: {alive:#?}");

    gw.raise_budget(RaiseBudgetRequest {
        run_id: run_id.clone(),
        amount_usd: "0.05".into(),
    })
    .await
    .unwrap();
    let run = wait_finished(&mut gw, &run_id, LONG).await;
    assert_eq!(run.state, RunState::Completed as i32, "{run:#?}");
    assert_eq!(run.forks_succeeded, 3);
    let mut ledger = BudgetLedgerClient::new(mesh.channel("budget-ledger").await.unwrap());
    let account = run_account(&mut ledger, &run_id).await;
    assert_eq!(account.spent_micros, 60_000);
    assert_eq!(account.reserved_micros, 0);
}
