//! Long outages mid-run: every sandbox-provisioner replica away for a minute. Forks
//! whose sandboxes died with it start again on new ones once it is back, forks not yet
//! started wait for it, and the run completes with every fork succeeded, the ledger
//! exact and nothing left after a janitor sweep. And a wave's creates while the
//! provisioner is away: retried until it is back, given up after minutes.

use forkyard_proto::{
    budget::v1::budget_ledger_client::BudgetLedgerClient,
    common::v1::ForkStatus,
    gateway::v1::{LaunchRunRequest, RunState},
    janitor::v1::{SweepRequest, janitor_client::JanitorClient},
};
use forkyard_tests::{
    Mesh,
    fixture::{LONG, setup, status_of},
    repo,
    support::{
        Gateway, fork_result, launch, left_after_settling, run_account, sandbox_processes,
        wait_finished, wait_until, workspaces_left,
    },
};
use std::time::Duration;

const AGENT: &str = r#"echo "fork $FORKYARD_FORK" > "fork-$FORKYARD_FORK.txt"
sleep 4
printf '{"type":"result","total_cost_usd":0.001,"usage":{"input_tokens":10,"output_tokens":2}}\n'"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provisioner_away_for_a_minute_delays_forks_and_loses_none() {
    let mut mesh = Mesh::start().await.expect("mesh starts");
    let src = tempfile::tempdir().unwrap();
    repo::create(src.path()).unwrap();
    let mut gw = Gateway::new(mesh.channel("gateway").await.unwrap());
    let run_id = gw
        .launch_run(LaunchRunRequest {
            request_id: "provisioner-outage".into(),
            ..launch(src.path(), 4, 2, AGENT)
        })
        .await
        .unwrap()
        .into_inner()
        .run_id;
    // Both agents running in their sandboxes when the provisioner goes.
    wait_until(&mut gw, &run_id, Duration::from_secs(60), |r| {
        r.forks
            .iter()
            .filter(|f| f.phase == "running agent")
            .count()
            == 2
    })
    .await;

    mesh.kill9("sandbox-provisioner");
    tokio::time::sleep(Duration::from_secs(60)).await;
    mesh.start_service("sandbox-provisioner").unwrap();
    mesh.wait_serving("sandbox-provisioner", Duration::from_secs(60))
        .await
        .unwrap();

    let run = wait_finished(&mut gw, &run_id, Duration::from_secs(240)).await;
    assert_eq!(run.state, RunState::Completed as i32, "{run:#?}");
    for fork in 1..=4u32 {
        let f = fork_result(&mut gw, &run_id, fork).await;
        assert_eq!(
            f.status,
            ForkStatus::Succeeded as i32,
            "fork {fork}: {}",
            f.error
        );
        assert!(
            f.patch.contains(&format!("+fork {fork}")),
            "fork {fork}: {}",
            f.patch
        );
    }
    let mut ledger = BudgetLedgerClient::new(mesh.channel("budget-ledger").await.unwrap());
    let account = run_account(&mut ledger, &run_id).await;
    assert_eq!(account.spent_micros, run.cost_micros, "{account:#?}");
    // Known without the run's word: four agents at $0.001, each reported once at its end
    // (the attempts lost with the provisioner had not reached it).
    assert_eq!(account.spent_micros, 4 * 1_000, "{account:#?}");
    assert_eq!(account.reserved_micros, 0, "{account:#?}");

    // The sandboxes the outage took with it are the janitor's: one sweep, nothing left.
    let mut janitor = JanitorClient::new(mesh.channel("janitor").await.unwrap());
    janitor.sweep_now(SweepRequest::default()).await.unwrap();
    let workspaces = left_after_settling(|| workspaces_left(mesh.state_dir())).await;
    assert!(workspaces.is_empty(), "{workspaces:?}");
    let left = left_after_settling(|| sandbox_processes(mesh.state_dir())).await;
    assert!(left.is_empty(), "{left:#?}");
}

/// The seed's create policy (3 tries, 5 s then 10 s apart) for a wave: a provisioner that
/// is back within it loses no fork; one that is not fails the forks naming the step, and
/// gives their reservations back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn creates_are_retried_while_the_provisioner_is_away() {
    let (mut mesh, src, mut gw) = setup().await;
    let mut ledger = BudgetLedgerClient::new(mesh.channel("budget-ledger").await.unwrap());
    let provisioner = "sandbox-provisioner";

    mesh.terminate(provisioner, Duration::from_secs(30))
        .expect("the provisioner stops");
    let back = gw
        .launch_run(launch(src.path(), 2, 2, "echo x > f.txt"))
        .await
        .unwrap()
        .into_inner()
        .run_id;
    // The wave is creating its sandboxes (and failing: nothing listens) before the
    // provisioner is back.
    wait_until(&mut gw, &back, Duration::from_secs(60), |r| {
        r.forks.iter().any(|f| f.phase == "creating sandbox")
    })
    .await;
    mesh.start_service(provisioner).unwrap();
    mesh.wait_serving(provisioner, Duration::from_secs(60))
        .await
        .unwrap();
    let run = wait_finished(&mut gw, &back, LONG).await;
    assert_eq!(run.forks_succeeded, 2, "{run:#?}");
    assert_eq!(run_account(&mut ledger, &back).await.reserved_micros, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_gives_up_once_the_provisioner_stays_away_for_minutes() {
    let (mut mesh, src, mut gw) = setup().await;
    let mut ledger = BudgetLedgerClient::new(mesh.channel("budget-ledger").await.unwrap());
    mesh.terminate("sandbox-provisioner", Duration::from_secs(30))
        .expect("the provisioner stops");
    let gone = gw
        .launch_run(launch(src.path(), 1, 1, "echo x > f.txt"))
        .await
        .unwrap()
        .into_inner()
        .run_id;
    let run = wait_finished(&mut gw, &gone, Duration::from_secs(260)).await;
    let fork = &run.forks[0];
    assert_eq!(status_of(&run, 1), ForkStatus::Failed, "{run:#?}");
    assert!(fork.error.starts_with("create sandbox: "), "{}", fork.error);
    // Seven tries, 5, 10, 20, 40, 60 and 60 s apart: an outage shorter than that only
    // delays the fork (e2e_outage).
    let took = fork.finished_unix_ms - fork.started_unix_ms;
    assert!(took >= 195_000, "gave up after {took} ms: {fork:#?}");
    let account = run_account(&mut ledger, &gone).await;
    assert_eq!(account.reserved_micros, 0, "{account:#?}");
    assert_eq!(account.spent_micros, 0, "{account:#?}");
}

/// A cancel while the only provisioner is down: the run's destroys are tried until it
/// is back (for up to five minutes), so its sandboxes go without the janitor. They used
/// to be given up after about 6 s and stay, with their cgroups, until a sweep.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_while_the_provisioner_is_away_orphans_nothing() {
    use forkyard_proto::gateway::v1::CancelRunRequest;
    let mut mesh = Mesh::start().await.expect("mesh starts");
    let src = tempfile::tempdir().unwrap();
    repo::create(src.path()).unwrap();
    let mut gw = Gateway::new(mesh.channel("gateway").await.unwrap());
    let run_id = gw
        .launch_run(LaunchRunRequest {
            request_id: "cancel-in-outage".into(),
            ..launch(src.path(), 3, 3, "sleep 300")
        })
        .await
        .unwrap()
        .into_inner()
        .run_id;
    let all_made = wait_until(&mut gw, &run_id, Duration::from_secs(120), |r| {
        r.forks
            .iter()
            .filter(|f| f.phase == "running agent")
            .count()
            == 3
    })
    .await;
    assert_eq!(all_made.forks.len(), 3, "{all_made:#?}");
    assert_eq!(workspaces_left(mesh.state_dir()).len(), 3);

    mesh.kill9("sandbox-provisioner");
    gw.cancel_run(CancelRunRequest {
        run_id: run_id.clone(),
        ..Default::default()
    })
    .await
    .unwrap();
    // Away for 30 s, well past the three tries the destroys used to get.
    tokio::time::sleep(Duration::from_secs(30)).await;
    mesh.start_service("sandbox-provisioner").unwrap();
    mesh.wait_serving("sandbox-provisioner", Duration::from_secs(60))
        .await
        .unwrap();

    let run = wait_finished(&mut gw, &run_id, Duration::from_secs(240)).await;
    assert_eq!(run.state, RunState::Cancelled as i32, "{run:#?}");
    // No janitor sweep: the run's own cleanup removed them.
    let left = left_after_settling(|| workspaces_left(mesh.state_dir())).await;
    assert!(left.is_empty(), "sandboxes left to the janitor: {left:?}");
    assert!(sandbox_processes(mesh.state_dir()).is_empty());
}
