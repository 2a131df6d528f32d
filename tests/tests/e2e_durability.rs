//! Durability: `kill -9` the gateway (which hosts the workflows) and the agent-runner in
//! the middle of a run, start them again, and the run completes with every fork
//! accounted for, never two sandboxes alive for one fork, and the ledger exact.

use forkyard_proto::{
    budget::v1::budget_ledger_client::BudgetLedgerClient,
    common::v1::ForkStatus,
    gateway::v1::{LaunchRunRequest, Run, RunState},
    labels,
    sandbox::v1::{ListSandboxesRequest, sandbox_provisioner_client::SandboxProvisionerClient},
};
use forkyard_tests::{
    Mesh, repo,
    support::{
        Gateway, assert_nothing_left_on_host, fork_result, launch, left_after_settling,
        run_account, sandbox_processes, wait_finished, wait_until, workspaces_left,
    },
};
use std::{
    collections::{HashMap, HashSet},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

/// Fork n spends $0.00n1: distinct per fork, and within a fork's share of a $1 budget even
/// with 12 forks ($0.0833), so no fork depends on another having released its reservation
/// first (at $0.0n1, fork 9 overspent its share and failed whenever it committed first).
const AGENT: &str = r#"sleep 5; echo "fork $FORKYARD_FORK" > done.txt; printf '{"total_cost_usd": 0.00%d1}\n' "$FORKYARD_FORK""#;

/// Each fork's sandboxes (by the fork's label): the most alive at once for any one fork,
/// and every id seen per fork.
type SandboxesSeen = (usize, HashMap<String, HashSet<String>>);

/// Watches every sandbox of the run until `stop`: per fork, never two alive at once.
async fn watch_sandboxes_per_fork(
    mesh: &Mesh,
    run_id: &str,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<SandboxesSeen> {
    let mut prov =
        SandboxProvisionerClient::new(mesh.channel("sandbox-provisioner").await.unwrap());
    let run_id = run_id.to_owned();
    tokio::spawn(async move {
        let mut worst = 0usize;
        let mut ids: HashMap<String, HashSet<String>> = HashMap::new();
        while !stop.load(Ordering::Relaxed) {
            let sel = HashMap::from([(labels::RUN_ID.to_owned(), run_id.clone())]);
            if let Ok(r) = prov
                .list_sandboxes(ListSandboxesRequest {
                    label_selector: sel,
                })
                .await
            {
                let mut per_fork: HashMap<String, usize> = HashMap::new();
                for s in r.into_inner().sandboxes {
                    let fork = s.labels.get(labels::FORK).cloned().unwrap_or_default();
                    *per_fork.entry(fork.clone()).or_default() += 1;
                    ids.entry(fork).or_default().insert(s.id);
                }
                worst = worst.max(per_fork.values().copied().max().unwrap_or(0));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        (worst, ids)
    })
}

/// Both first forks are inside their agents: crash the gateway and the agent runner, and
/// start them again.
async fn crash_both_mid_agents(mesh: &mut Mesh, gw: &mut Gateway, run_id: &str) {
    wait_until(gw, run_id, Duration::from_secs(60), |r| {
        r.forks_running == 2
    })
    .await;
    let mut prov =
        SandboxProvisionerClient::new(mesh.channel("sandbox-provisioner").await.unwrap());
    for _ in 0..100 {
        let busy = prov
            .list_sandboxes(ListSandboxesRequest::default())
            .await
            .unwrap()
            .into_inner()
            .sandboxes;
        if busy.iter().filter(|s| s.running_execs > 0).count() == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    mesh.kill9("gateway");
    mesh.kill9("agent-runner");
    tokio::time::sleep(Duration::from_secs(1)).await;
    mesh.start_service("agent-runner").unwrap();
    mesh.start_service("gateway").unwrap();
    mesh.wait_serving("agent-runner", Duration::from_secs(60))
        .await
        .unwrap();
    mesh.wait_serving("gateway", Duration::from_secs(60))
        .await
        .unwrap();
}

/// Every fork succeeded, was charged once, and ran in one sandbox, ever.
async fn assert_each_fork_ran_once(
    gw: &mut Gateway,
    run_id: &str,
    ids: &HashMap<String, HashSet<String>>,
) {
    for fork in 1..=3u32 {
        let f = fork_result(gw, run_id, fork).await;
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
        assert_eq!(f.cost_micros, i64::from(fork) * 1_000 + 100);
        // The retried agent ran in the same sandbox: one sandbox per fork, ever.
        let seen = ids.get(&fork.to_string()).cloned().unwrap_or_default();
        assert_eq!(seen.len(), 1, "fork {fork} had sandboxes {seen:?}");
        assert!(seen.contains(&f.sandbox_id));
    }
}

/// The ledger holds each fork's charge once and nothing reserved; no workspace or
/// process is left.
async fn assert_ledger_exact_and_nothing_left(mesh: &Mesh, run_id: &str, run: &Run) {
    let mut ledger = BudgetLedgerClient::new(mesh.channel("budget-ledger").await.unwrap());
    let account = run_account(&mut ledger, run_id).await;
    assert_eq!(account.spent_micros, 6_300, "each fork charged once");
    assert_eq!(account.spent_micros, run.cost_micros);
    assert_eq!(account.reserved_micros, 0);
    assert_nothing_left_on_host(mesh.state_dir());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_gateway_and_agent_runner_mid_run_loses_nothing() {
    let mut mesh = Mesh::start().await.expect("mesh starts");
    let src = tempfile::tempdir().unwrap();
    repo::create(src.path()).unwrap();
    let mut gw = Gateway::new(mesh.channel("gateway").await.unwrap());
    let run_id = gw
        .launch_run(LaunchRunRequest {
            request_id: "durable".into(),
            ..launch(src.path(), 3, 2, AGENT)
        })
        .await
        .unwrap()
        .into_inner()
        .run_id;
    let stop = Arc::new(AtomicBool::new(false));
    let watcher = watch_sandboxes_per_fork(&mesh, &run_id, stop.clone()).await;
    crash_both_mid_agents(&mut mesh, &mut gw, &run_id).await;

    let mut gw = Gateway::new(mesh.channel("gateway").await.unwrap());
    let run = wait_finished(&mut gw, &run_id, Duration::from_secs(240)).await;
    stop.store(true, Ordering::Relaxed);
    let (worst, ids) = watcher.await.unwrap();
    assert_eq!(run.state, RunState::Completed as i32, "{run:#?}");
    assert_eq!(run.forks_succeeded, 3, "{run:#?}");
    assert!(worst <= 1, "{worst} sandboxes alive at once for one fork");
    assert_each_fork_ran_once(&mut gw, &run_id, &ids).await;
    assert_ledger_exact_and_nothing_left(&mesh, &run_id, &run).await;
}

/// `kill -9` of the gateway right after a cancel was accepted, with every fork inside its
/// agent: the restarted gateway finishes the cancel. The run ends CANCELLED, every
/// sandbox is destroyed and every reservation settled (what the agents spent
/// committed, the rest released), with no janitor sweep.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_killed_during_a_cancel_still_cleans_up_every_fork() {
    let mut mesh = Mesh::start().await.expect("mesh starts");
    let src = tempfile::tempdir().unwrap();
    repo::create(src.path()).unwrap();
    let mut gw = Gateway::new(mesh.channel("gateway").await.unwrap());
    let run_id = gw
        .launch_run(LaunchRunRequest {
            request_id: "cancel-kill".into(),
            ..launch(src.path(), 3, 3, "sleep 60")
        })
        .await
        .unwrap()
        .into_inner()
        .run_id;
    wait_until(&mut gw, &run_id, Duration::from_secs(60), |r| {
        r.forks_running == 3 && r.forks.iter().all(|f| f.sandbox_ready_unix_ms > 0)
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    gw.cancel_run(forkyard_proto::gateway::v1::CancelRunRequest {
        run_id: run_id.clone(),
        reason: "chaos".into(),
    })
    .await
    .unwrap();
    mesh.kill9("gateway");
    tokio::time::sleep(Duration::from_secs(1)).await;
    mesh.start_service("gateway").unwrap();
    mesh.wait_serving("gateway", Duration::from_secs(60))
        .await
        .unwrap();

    let mut gw = Gateway::new(mesh.channel("gateway").await.unwrap());
    let run = wait_finished(&mut gw, &run_id, Duration::from_secs(120)).await;
    assert_eq!(run.state, RunState::Cancelled as i32, "{run:#?}");
    for f in &run.forks {
        assert_eq!(f.status, ForkStatus::Cancelled as i32, "{f:#?}");
    }
    let mut ledger = BudgetLedgerClient::new(mesh.channel("budget-ledger").await.unwrap());
    let account = run_account(&mut ledger, &run_id).await;
    assert_eq!(account.reserved_micros, 0, "{account:#?}");
    assert_eq!(account.spent_micros, run.cost_micros, "{account:#?}");
    // `sleep 60` reports nothing: cancelled mid-agent, no fork spent anything.
    assert_eq!(account.spent_micros, 0, "{account:#?}");
    let left = left_after_settling(|| workspaces_left(mesh.state_dir())).await;
    assert!(left.is_empty(), "{left:?}");
    assert!(
        sandbox_processes(mesh.state_dir()).is_empty(),
        "{:?}",
        sandbox_processes(mesh.state_dir())
    );
}

/// `kill -9` of the gateway while a wave is being prepared (its reserves and creates in
/// flight, nothing recorded yet): the restarted gateway prepares the wave again under the
/// same idempotency keys, so every fork gets one sandbox and one reservation, and the
/// run completes with the ledger exact and nothing left behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_killed_while_a_wave_is_prepared_makes_each_sandbox_once() {
    // The gateway dies as the wave's first create answers (a fault point, debug
    // builds): its other creates under way, nothing of the wave recorded.
    let mut mesh = Mesh::start_with(forkyard_tests::mesh::MeshOptions {
        service_env: vec![(
            "gateway".into(),
            "FORKYARD_FAULTS".into(),
            "wave.after-create".into(),
        )],
        ..Default::default()
    })
    .await
    .expect("mesh starts");
    let src = tempfile::tempdir().unwrap();
    repo::create(src.path()).unwrap();
    let mut gw = Gateway::new(mesh.channel("gateway").await.unwrap());
    let mut prov =
        SandboxProvisionerClient::new(mesh.channel("sandbox-provisioner").await.unwrap());
    let forks = 12;
    let run_id = gw
        .launch_run(LaunchRunRequest {
            request_id: "wave-kill".into(),
            ..launch(src.path(), forks, forks, AGENT)
        })
        .await
        .unwrap()
        .into_inner()
        .run_id;
    let died = tokio::task::block_in_place(|| mesh.wait_exit("gateway", Duration::from_secs(120)));
    assert!(
        died.is_some_and(|s| !s.success()),
        "the gateway did not die mid-wave: {died:?}"
    );
    let made_before = prov
        .list_sandboxes(ListSandboxesRequest::default())
        .await
        .unwrap()
        .into_inner()
        .sandboxes
        .len();
    assert!(made_before >= 1, "killed before any create answered");
    eprintln!("{made_before} of {forks} sandboxes made when the gateway was killed");
    mesh.set_service_env("gateway", "FORKYARD_FAULTS", None);
    mesh.start_service("gateway").unwrap();
    mesh.wait_serving("gateway", Duration::from_secs(60))
        .await
        .unwrap();

    let mut gw = Gateway::new(mesh.channel("gateway").await.unwrap());
    let run = wait_finished(&mut gw, &run_id, Duration::from_secs(240)).await;
    assert_eq!(run.state, RunState::Completed as i32, "{run:#?}");
    let not_succeeded: Vec<_> = run
        .forks
        .iter()
        .filter(|f| f.status != ForkStatus::Succeeded as i32)
        .map(|f| (f.fork, f.status, f.phase.clone(), f.error.clone()))
        .collect();
    assert!(not_succeeded.is_empty(), "{not_succeeded:#?}");
    assert_eq!(run.forks_succeeded, forks, "{run:#?}");
    let mut ids = HashSet::new();
    for fork in 1..=forks {
        let f = fork_result(&mut gw, &run_id, fork).await;
        assert!(
            f.patch.contains(&format!("+fork {fork}")),
            "fork {fork}: {}",
            f.patch
        );
        assert!(ids.insert(f.sandbox_id.clone()), "two forks, one sandbox");
    }
    let mut ledger = BudgetLedgerClient::new(mesh.channel("budget-ledger").await.unwrap());
    let account = run_account(&mut ledger, &run_id).await;
    assert_eq!(account.spent_micros, run.cost_micros, "{account:#?}");
    assert_eq!(account.reserved_micros, 0, "{account:#?}");
    // Known without the run's word: fork n reported $0.00<n>1 (its AGENT), once.
    let expected: i64 = (1..=forks)
        .map(|n| {
            let usd: f64 = format!("0.00{n}1").parse().unwrap();
            (usd * 1e6).round() as i64
        })
        .sum();
    assert_eq!(account.spent_micros, expected, "{account:#?}");
    // Every sandbox made before the kill was a fork's, and is gone with its fork.
    let left = left_after_settling(|| workspaces_left(mesh.state_dir())).await;
    assert!(
        left.is_empty(),
        "{left:?} ({made_before} sandboxes existed at the kill)"
    );
}
