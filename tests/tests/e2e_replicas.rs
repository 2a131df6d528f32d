//! End to end: two sandbox-provisioner replicas on one Temporal. The gateway spreads
//! creates over both (`FORKYARD_PROVISIONER_ADDR` lists them); everything after the
//! create must reach the replica that owns the sandbox (its `owner_endpoint` for the
//! gateway's and the agent's gRPC calls, its `owner_task_queue` for the verify
//! activity), or the fork fails and the sandbox leaks on its owner.

use forkyard_proto::{
    common::v1::{ForkStatus, VerifyStatus},
    gateway::v1::{LaunchRunRequest, Run, RunState},
    labels,
    sandbox::v1::{ListSandboxesRequest, sandbox_provisioner_client::SandboxProvisionerClient},
};
use forkyard_tests::{
    Mesh, repo,
    support::{
        Gateway, fork_result, launch, left_after_settling, sandbox_processes, wait_finished,
        workspaces_left,
    },
};
use std::{
    collections::{BTreeMap, HashMap},
    path::{Path, PathBuf},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};
use tonic::transport::Channel;

const FORKS: u32 = 8;

/// Long enough for the watcher to see every sandbox on its replica.
const AGENT: &str = r#"echo "fork $FORKYARD_FORK" > "fork-$FORKYARD_FORK.txt"
sleep 3
printf '{"type":"result","total_cost_usd":0.001,"usage":{"input_tokens":10,"output_tokens":2}}\n'"#;

type Prov = SandboxProvisionerClient<Channel>;

/// What a replica reported about one sandbox while it was alive.
#[derive(Debug, Clone, PartialEq)]
struct Seen {
    replica: &'static str,
    owner_endpoint: String,
    owner_task_queue: String,
}

/// A mesh with a second provisioner replica ("replica-b"), the gateway restarted knowing
/// both (it makes the sandboxes): the mesh, both endpoints and replica b's state dir.
async fn two_provisioner_replicas() -> (Mesh, String, String, std::path::PathBuf) {
    let mut mesh = Mesh::start().await.expect("mesh starts");
    let (b_endpoint, b_state) = mesh
        .start_provisioner_replica("replica-b")
        .await
        .expect("second provisioner replica starts");
    let a_endpoint = mesh.endpoint("sandbox-provisioner");
    mesh.set_env(
        "FORKYARD_PROVISIONER_ADDR",
        &format!("{a_endpoint},{b_endpoint}"),
    );
    mesh.terminate("gateway", Duration::from_secs(30));
    mesh.start_service("gateway").expect("gateway restarts");
    mesh.wait_serving("gateway", Duration::from_secs(60))
        .await
        .expect("gateway serves again");
    (mesh, a_endpoint, b_endpoint, b_state)
}

/// Samples both replicas' sandboxes of the run until stopped.
fn watch(
    replicas: Vec<(&'static str, Prov)>,
    run_id: String,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<BTreeMap<String, Vec<Seen>>> {
    tokio::spawn(async move {
        let mut seen: BTreeMap<String, Vec<Seen>> = BTreeMap::new();
        while !stop.load(Ordering::Relaxed) {
            for (name, prov) in &replicas {
                let req = ListSandboxesRequest {
                    label_selector: HashMap::from([(labels::RUN_ID.to_owned(), run_id.clone())]),
                };
                let Ok(resp) = prov.clone().list_sandboxes(req).await else {
                    continue;
                };
                for s in resp.into_inner().sandboxes {
                    let entry = Seen {
                        replica: name,
                        owner_endpoint: s.owner_endpoint,
                        owner_task_queue: s.owner_task_queue,
                    };
                    let list = seen.entry(s.id).or_default();
                    if !list.contains(&entry) {
                        list.push(entry);
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        seen
    })
}

/// The Temporal server lists an activity poller on `queue` (`temporal task-queue describe`).
fn has_activity_poller(mesh: &Mesh, queue: &str) -> bool {
    let out = std::process::Command::new(forkyard_tests::mesh::temporal_cli())
        .args(["task-queue", "describe", "--task-queue", queue])
        .args(["--task-queue-type", "activity", "-o", "json", "--address"])
        .arg(mesh.temporal_address())
        .output()
        .expect("run the temporal CLI");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    v["pollers"].as_array().is_some_and(|p| !p.is_empty())
}

/// The replica's log has a "sandbox destroyed" line for `id`.
fn destroyed_in_log(log: &Path, id: &str) -> bool {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .any(|l| l.contains("\"sandbox destroyed\"") && l.contains(id))
}

/// The two provisioner replicas: their clients, endpoints, and b's state dir.
struct Replicas {
    a: Prov,
    b: Prov,
    a_endpoint: String,
    b_endpoint: String,
    b_state: PathBuf,
}

impl Replicas {
    async fn connect(
        mesh: &Mesh,
        a_endpoint: String,
        b_endpoint: String,
        b_state: PathBuf,
    ) -> Self {
        let a = SandboxProvisionerClient::new(mesh.channel("sandbox-provisioner").await.unwrap());
        let b = SandboxProvisionerClient::new(
            tonic::transport::Endpoint::from_shared(b_endpoint.clone())
                .unwrap()
                .connect()
                .await
                .unwrap(),
        );
        Self {
            a,
            b,
            a_endpoint,
            b_endpoint,
            b_state,
        }
    }
}

/// Launches the run of `attempt`, watching both replicas' sandboxes until it finishes:
/// its id, its end and what the replicas said of each sandbox.
async fn run_watched(
    gw: &mut Gateway,
    src: &Path,
    replicas: &Replicas,
    attempt: u32,
) -> (String, Run, BTreeMap<String, Vec<Seen>>) {
    let launched = gw
        .launch_run(LaunchRunRequest {
            request_id: format!("e2e-replicas-{attempt}"),
            // Runs on the owner replica's own queue: it sees the agent's file.
            verify_command: "ls fork-*.txt".into(),
            ..launch(src, FORKS, FORKS, AGENT)
        })
        .await
        .expect("launch")
        .into_inner();
    let stop = Arc::new(AtomicBool::new(false));
    let watcher = watch(
        vec![("a", replicas.a.clone()), ("b", replicas.b.clone())],
        launched.run_id.clone(),
        stop.clone(),
    );
    let run = wait_finished(gw, &launched.run_id, Duration::from_secs(240)).await;
    stop.store(true, Ordering::Relaxed);
    let seen = watcher.await.unwrap();
    (launched.run_id, run, seen)
}

/// Each replica really polls its own task queue (the one its records name).
fn assert_own_queues_polled(mesh: &Mesh, seen: &BTreeMap<String, Vec<Seen>>) {
    let mut own_queues: Vec<&str> = seen
        .values()
        .map(|s| s[0].owner_task_queue.as_str())
        .collect();
    own_queues.sort_unstable();
    own_queues.dedup();
    for queue in own_queues {
        assert!(has_activity_poller(mesh, queue), "nobody polls {queue}");
    }
}

/// Every fork completed, whichever replica created its sandbox, and its sandbox had one
/// owner, named in its record: each replica's sandboxes.
async fn assert_forks_ran_on_their_owners(
    gw: &mut Gateway,
    replicas: &Replicas,
    run_id: &str,
    run: &Run,
    seen: &BTreeMap<String, Vec<Seen>>,
) -> HashMap<&'static str, Vec<String>> {
    assert_eq!(run.state, RunState::Completed as i32, "{run:#?}");
    assert_eq!(run.forks_succeeded, FORKS, "{run:#?}");
    let mut per_replica: HashMap<&str, Vec<String>> = HashMap::new();
    for summary in &run.forks {
        let f = fork_result(gw, run_id, summary.fork).await;
        assert_eq!(
            f.status,
            ForkStatus::Succeeded as i32,
            "fork {}: {}",
            f.fork,
            f.error
        );
        assert_eq!(
            f.verify,
            VerifyStatus::Passed as i32,
            "fork {} verified on its owner: {}",
            f.fork,
            f.verify_output_tail
        );
        assert!(
            f.patch.contains(&format!("+fork {}", f.fork)),
            "fork {} ran its agent in its own sandbox:\n{}",
            f.fork,
            f.patch
        );
        let owners = seen.get(&f.sandbox_id).unwrap_or_else(|| {
            panic!(
                "sandbox {} of fork {} never listed: {seen:#?}",
                f.sandbox_id, f.fork
            )
        });
        // One owner, and its record names it (endpoint and own task queue).
        assert_eq!(owners.len(), 1, "{} seen as {owners:?}", f.sandbox_id);
        let o = &owners[0];
        let endpoint = if o.replica == "a" {
            &replicas.a_endpoint
        } else {
            &replicas.b_endpoint
        };
        assert_eq!(&o.owner_endpoint, endpoint, "{}", f.sandbox_id);
        if o.replica == "b" {
            assert_eq!(o.owner_task_queue, "sandbox-provisioner/replica-b");
        } else {
            assert!(
                o.owner_task_queue.starts_with("sandbox-provisioner/")
                    && o.owner_task_queue != "sandbox-provisioner/replica-b",
                "{o:?}"
            );
        }
        per_replica
            .entry(o.replica)
            .or_default()
            .push(f.sandbox_id.clone());
    }
    per_replica
}

/// Each sandbox was destroyed by its owner: nothing is left on either replica, and the
/// owner's log records the destroy.
async fn assert_owners_destroyed_them(
    mesh: &Mesh,
    replicas: &Replicas,
    per_replica: &HashMap<&str, Vec<String>>,
) {
    for (name, prov) in [("a", &replicas.a), ("b", &replicas.b)] {
        let left = prov
            .clone()
            .list_sandboxes(ListSandboxesRequest::default())
            .await
            .unwrap()
            .into_inner()
            .sandboxes;
        assert!(left.is_empty(), "replica {name} still has {left:?}");
    }
    let logs = mesh.state_dir().join("logs");
    for (replica, log) in [
        ("a", logs.join("sandbox-provisioner.log")),
        ("b", logs.join("replica-b.log")),
    ] {
        for id in per_replica.get(replica).into_iter().flatten() {
            assert!(
                destroyed_in_log(&log, id),
                "replica {replica} never destroyed {id}"
            );
        }
    }
    for state in [mesh.state_dir(), replicas.b_state.as_path()] {
        assert!(
            workspaces_left(state).is_empty(),
            "{:?}",
            workspaces_left(state)
        );
        assert!(
            sandbox_processes(state).is_empty(),
            "{:?}",
            sandbox_processes(state)
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forks_land_on_two_replicas_and_each_owner_runs_and_destroys_its_sandboxes() {
    let (mesh, a_endpoint, b_endpoint, b_state) = two_provisioner_replicas().await;
    let replicas = Replicas::connect(&mesh, a_endpoint, b_endpoint, b_state).await;
    let mut gw = Gateway::new(mesh.channel("gateway").await.unwrap());
    let src = tempfile::tempdir().unwrap();
    repo::create(src.path()).unwrap();

    // The gateway balances creates by load, so one run can land on a single replica by
    // chance: up to three runs, each checked in full.
    for attempt in 1..=3 {
        let (run_id, run, seen) = run_watched(&mut gw, src.path(), &replicas, attempt).await;
        assert_own_queues_polled(&mesh, &seen);
        let per_replica =
            assert_forks_ran_on_their_owners(&mut gw, &replicas, &run_id, &run, &seen).await;
        assert_owners_destroyed_them(&mesh, &replicas, &per_replica).await;
        if per_replica.len() == 2 {
            return;
        }
        eprintln!("run {attempt}: every fork landed on one replica ({per_replica:?}); again");
    }
    panic!("in 3 runs of {FORKS} forks, the forks never landed on both replicas");
}

/// A provisioner replica killed (SIGKILL) while forks' agents run in its sandboxes: the
/// sandboxes are gone with it, so those forks start again on new sandboxes (on the
/// replica that is left) and succeed; what the lost attempts spent stays in the run's
/// cost, which is what the ledger holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forks_whose_provisioner_is_killed_start_again_on_a_new_sandbox() {
    let (mut mesh, _, b_endpoint, b_state) = two_provisioner_replicas().await;
    let b = SandboxProvisionerClient::new(
        tonic::transport::Endpoint::from_shared(b_endpoint)
            .unwrap()
            .connect()
            .await
            .unwrap(),
    );
    let mut gw = Gateway::new(mesh.channel("gateway").await.unwrap());
    let mut ledger = forkyard_proto::budget::v1::budget_ledger_client::BudgetLedgerClient::new(
        mesh.channel("budget-ledger").await.unwrap(),
    );
    let src = tempfile::tempdir().unwrap();
    repo::create(src.path()).unwrap();
    // A second of CPU first, so a fork has spent (sandbox time, charged every
    // heartbeat) when its sandbox is lost, and long enough that the forks on the other
    // replica still hold their reservations when the lost ones start again: a new start
    // must reserve only what its fork budget has left (the budget is six fork budgets
    // and 4 micros), or it is refused and the run waits for a raise.
    const SLOW: &str = r#"echo "fork $FORKYARD_FORK" > "fork-$FORKYARD_FORK.txt"
timeout 1 sh -c 'while :; do :; done' || true
sleep 25
printf '{"type":"result","total_cost_usd":0.001,"usage":{"input_tokens":10,"output_tokens":2}}\n'"#;

    for attempt in 1..=3 {
        let run_id = gw
            .launch_run(LaunchRunRequest {
                request_id: format!("e2e-replica-killed-{attempt}"),
                ..launch(src.path(), 6, 6, SLOW)
            })
            .await
            .expect("launch")
            .into_inner()
            .run_id;
        // Wait for replica b to hold some of the run's sandboxes, their agents started.
        let mut on_b = 0;
        for _ in 0..100 {
            on_b = b
                .clone()
                .list_sandboxes(ListSandboxesRequest::default())
                .await
                .map(|r| r.into_inner().sandboxes.len())
                .unwrap_or(0);
            if on_b > 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        if on_b == 0 {
            let _ = wait_finished(&mut gw, &run_id, Duration::from_secs(120)).await;
            eprintln!("run {attempt}: no fork landed on replica b; again");
            continue;
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
        mesh.kill9("replica-b");

        let run = wait_finished(&mut gw, &run_id, Duration::from_secs(200)).await;
        assert_eq!(run.state, RunState::Completed as i32, "{run:#?}");
        for f in &run.forks {
            assert_eq!(
                f.status,
                ForkStatus::Succeeded as i32,
                "fork {} (it had {on_b} sandboxes on the killed replica): {}",
                f.fork,
                f.error
            );
            let full = fork_result(&mut gw, &run_id, f.fork).await;
            assert!(
                full.patch.contains(&format!("+fork {}", f.fork)),
                "fork {}: {}",
                f.fork,
                full.patch
            );
        }
        let account = forkyard_tests::support::run_account(&mut ledger, &run_id).await;
        assert_eq!(account.spent_micros, run.cost_micros, "{account:#?}");
        assert_eq!(account.reserved_micros, 0, "{account:#?}");
        // What is known without the run's word: each agent reported $0.001 once, at its
        // end, which the lost attempts never reached (a double charge would show here).
        let mut model = 0;
        for fork in 1..=6 {
            model += fork_result(&mut gw, &run_id, fork).await.model_cost_micros;
        }
        // (The lost attempts' sandbox time, a few micro-dollars, is counted in with the
        // model's share of a re-started fork; a second charge of a report is 1,000.)
        assert!(
            (6 * 1_000..7 * 1_000).contains(&model),
            "the agents' own spend, each once: {model}"
        );
        // Nothing of the run is left on the replica that lived, and no process of the
        // killed replica's sandboxes outlived it (bubblewrap dies with its parent).
        let left = left_after_settling(|| workspaces_left(mesh.state_dir())).await;
        assert!(left.is_empty(), "{left:?}");
        assert!(sandbox_processes(mesh.state_dir()).is_empty());
        assert!(
            sandbox_processes(&b_state).is_empty(),
            "{:?}",
            sandbox_processes(&b_state)
        );
        return;
    }
    panic!("in 3 runs no fork landed on replica b");
}
