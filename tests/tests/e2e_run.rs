//! End to end: the real mesh runs multi-fork runs, keeps the ledger exact, leaks nothing,
//! answers grpcurl through reflection, drains on SIGTERM, and fails a run in which no
//! fork succeeds. Cancelling and refused launches: e2e_cancel.

use forkyard_proto::{
    budget::v1::budget_ledger_client::BudgetLedgerClient,
    common::v1::ForkStatus,
    gateway::v1::{LaunchRunRequest, ListRunsRequest, Run, RunState},
    labels,
    sandbox::v1::{ListSandboxesRequest, sandbox_provisioner_client::SandboxProvisionerClient},
};
use forkyard_tests::{
    Mesh, repo,
    support::{
        Gateway, assert_nothing_left_on_host, fork_result, grpcurl, launch, max_overlap,
        run_account, sandbox_processes, wait_finished,
    },
};
use std::{
    collections::HashMap,
    path::Path,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};
use tonic::transport::Channel;

type Provisioner = SandboxProvisionerClient<Channel>;

/// Each fork writes its own file and edits a shared one differently, then reports a
/// cost of (fork × 10,000 + 5,000) micro-USD the way `claude -p --output-format json` does.
const AGENT: &str = r#"echo "fork $FORKYARD_FORK says: $FORKYARD_PROMPT" > "fork-$FORKYARD_FORK.txt"
sed -i "s/two/two (fork $FORKYARD_FORK)/" src/lib.txt
sleep 1.5
printf '{"type":"result","total_cost_usd":0.0%d5,"usage":{"input_tokens":100,"output_tokens":20}}\n' "$FORKYARD_FORK""#;

/// Samples how many of a run's sandboxes are alive, until stopped.
struct SandboxWatch {
    stop: Arc<AtomicUsize>,
    sampler: tokio::task::JoinHandle<usize>,
}

impl SandboxWatch {
    fn start(mut prov: Provisioner, run_id: String) -> Self {
        let stop = Arc::new(AtomicUsize::new(0));
        let stopped = stop.clone();
        let sampler = tokio::spawn(async move {
            let mut max = 0;
            while stopped.load(Ordering::Relaxed) == 0 {
                let req = ListSandboxesRequest {
                    label_selector: HashMap::from([(labels::RUN_ID.to_owned(), run_id.clone())]),
                };
                if let Ok(resp) = prov.list_sandboxes(req).await {
                    max = max.max(resp.into_inner().sandboxes.len());
                }
                tokio::time::sleep(Duration::from_millis(40)).await;
            }
            max
        });
        Self { stop, sampler }
    }

    /// The most sandboxes seen alive at once.
    async fn stop(self) -> usize {
        self.stop.store(1, Ordering::Relaxed);
        self.sampler.await.unwrap()
    }
}

/// Launches the three forks, watched from the start, and launches them again with the
/// same request id, which starts nothing new.
async fn launch_watched(
    gw: &mut Gateway,
    prov: &Provisioner,
    src: &Path,
) -> (String, SandboxWatch) {
    let launched = gw
        .launch_run(LaunchRunRequest {
            request_id: "e2e-three".into(),
            ..launch(src, 3, 2, AGENT)
        })
        .await
        .expect("launch")
        .into_inner();
    assert!(launched.created);
    assert_eq!(launched.run_id, "run-e2e-three");
    let watch = SandboxWatch::start(prov.clone(), launched.run_id.clone());

    let again = gw
        .launch_run(LaunchRunRequest {
            request_id: "e2e-three".into(),
            ..launch(src, 3, 2, AGENT)
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(again.run_id, launched.run_id);
    assert!(!again.created);
    (launched.run_id, watch)
}

fn assert_completed_two_at_a_time(run: &Run, max_alive: usize) {
    assert_eq!(run.state, RunState::Completed as i32, "{run:#?}");
    assert_eq!(run.forks.len(), 3);
    assert_eq!(run.forks_succeeded, 3, "{run:#?}");
    assert!(max_alive >= 1, "the watcher never saw a sandbox");
    assert!(
        max_alive <= 2,
        "{max_alive} sandboxes alive at once with max_concurrent=2"
    );
    // Sampling can miss a short overlap; the forks' own lifetimes cannot.
    assert_eq!(
        max_overlap(&run.forks),
        2,
        "forks in flight at once: {:#?}",
        run.forks
    );
}

/// Each fork's result holds its own patch (the listing none), on the repo's base commit.
async fn assert_each_fork_has_its_own_patch(gw: &mut Gateway, run_id: &str, run: &Run, base: &str) {
    let mut patches = Vec::new();
    for summary in &run.forks {
        assert!(
            summary.patch.is_empty(),
            "the run listing carries no patches"
        );
        let f = &fork_result(gw, run_id, summary.fork).await;
        assert_eq!(
            f.status,
            ForkStatus::Succeeded as i32,
            "fork {}: {}",
            f.fork,
            f.error
        );
        assert_eq!(f.branch, format!("forkyard-fork-{}", f.fork));
        assert_eq!(f.base_commit, base);
        assert!(
            f.patch
                .contains(&format!("+fork {} says: make it better", f.fork)),
            "fork {} patch:\n{}",
            f.fork,
            f.patch
        );
        assert!(
            f.patch.contains(&format!("+two (fork {})", f.fork)),
            "fork {} patch:\n{}",
            f.fork,
            f.patch
        );
        let d = f.diffstat.expect("diffstat");
        assert_eq!(
            (d.files_changed, d.insertions, d.deletions),
            (2, 2, 1),
            "fork {}",
            f.fork
        );
        assert_eq!(f.cost_micros, i64::from(f.fork) * 10_000 + 5_000);
        patches.push(f.patch.clone());
    }
    patches.sort();
    patches.dedup();
    assert_eq!(patches.len(), 3, "each fork has its own patch");
}

/// The ledger agrees with the forks to the micro-dollar, and nothing stays reserved.
async fn assert_ledger_exact(mesh: &Mesh, run_id: &str, run: &Run) {
    let mut ledger = BudgetLedgerClient::new(mesh.channel("budget-ledger").await.unwrap());
    let account = run_account(&mut ledger, run_id).await;
    let total: i64 = run.forks.iter().map(|f| f.cost_micros).sum();
    assert_eq!(total, 75_000);
    assert_eq!(run.cost_micros, total);
    assert_eq!(account.spent_micros, total);
    assert_eq!(account.reserved_micros, 0);
    assert_eq!(account.available_micros, 1_000_000 - total);
}

/// Nothing leaks: no sandbox, no workspace, no process.
async fn assert_nothing_leaked(mesh: &Mesh, prov: &Provisioner) {
    let left = prov
        .clone()
        .list_sandboxes(ListSandboxesRequest::default())
        .await
        .unwrap()
        .into_inner()
        .sandboxes;
    assert!(left.is_empty(), "sandboxes left: {left:?}");
    assert_nothing_left_on_host(mesh.state_dir());
}

/// The real grpcurl sees every service through reflection, healthy, each advertising
/// exactly its own API.
fn assert_grpcurl_sees_every_service(mesh: &Mesh) {
    let apis = [
        ("gateway", "forkyard.gateway.v1.Gateway"),
        (
            "sandbox-provisioner",
            "forkyard.sandbox.v1.SandboxProvisioner",
        ),
        ("agent-runner", "forkyard.agent.v1.AgentRunner"),
        ("budget-ledger", "forkyard.budget.v1.BudgetLedger"),
        ("janitor", "forkyard.janitor.v1.Janitor"),
    ];
    for (service, api) in apis {
        let addr = format!("127.0.0.1:{}", mesh.port(service));
        let listed = grpcurl(&["-plaintext", &addr, "list"]);
        assert!(
            listed.contains("grpc.health.v1.Health"),
            "{service}: {listed}"
        );
        let forkyard_apis: Vec<&str> = listed
            .lines()
            .filter(|l| l.starts_with("forkyard."))
            .collect();
        assert_eq!(
            forkyard_apis,
            vec![api],
            "{service} advertises exactly its own API"
        );
        let health = grpcurl(&[
            "-plaintext",
            "-d",
            "{}",
            &addr,
            "grpc.health.v1.Health/Check",
        ]);
        assert!(health.contains("SERVING"), "{service}: {health}");
    }
}

/// grpcurl describes the gateway and reads the finished run through GetRun.
fn assert_grpcurl_gets_the_run(mesh: &Mesh, run_id: &str) {
    let gw_addr = format!("127.0.0.1:{}", mesh.port("gateway"));
    let described = grpcurl(&[
        "-plaintext",
        &gw_addr,
        "describe",
        "forkyard.gateway.v1.Gateway",
    ]);
    assert!(described.contains("rpc LaunchRun"), "{described}");
    let body = format!(r#"{{"run_id":"{run_id}"}}"#);
    let got = grpcurl(&[
        "-plaintext",
        "-d",
        &body,
        &gw_addr,
        "forkyard.gateway.v1.Gateway/GetRun",
    ]);
    let json: serde_json::Value = serde_json::from_str(&got).unwrap();
    assert_eq!(json["state"], "RUN_STATE_COMPLETED", "{got}");
    assert_eq!(json["forksSucceeded"], 3, "{got}");
}

/// SIGTERM: every service drains and exits cleanly.
fn assert_every_service_drains_on_sigterm(mut mesh: Mesh) {
    for service in forkyard_tests::mesh::SERVICES {
        let status = mesh.terminate(service, Duration::from_secs(20));
        assert!(
            status.is_some_and(|s| s.success()),
            "{service} on SIGTERM: {status:?}\n{}",
            mesh.log_tail(service)
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_forks_two_at_a_time_complete_with_exact_ledger_and_no_leaks() {
    let mesh = Mesh::start().await.expect("mesh starts");
    let src = tempfile::tempdir().unwrap();
    let base = repo::create(src.path()).unwrap();
    let mut gw = Gateway::new(mesh.channel("gateway").await.unwrap());
    let prov = Provisioner::new(mesh.channel("sandbox-provisioner").await.unwrap());

    let (run_id, watch) = launch_watched(&mut gw, &prov, src.path()).await;
    let run = wait_finished(&mut gw, &run_id, Duration::from_secs(180)).await;
    let max_alive = watch.stop().await;
    assert_completed_two_at_a_time(&run, max_alive);
    assert_each_fork_has_its_own_patch(&mut gw, &run_id, &run, &base).await;
    assert_ledger_exact(&mesh, &run_id, &run).await;
    assert_nothing_leaked(&mesh, &prov).await;
    assert_grpcurl_sees_every_service(&mesh);
    assert_grpcurl_gets_the_run(&mesh, &run_id);
    assert_every_service_drains_on_sigterm(mesh);
}

/// A wave wider than one preparation activity (100 forks) is prepared in several at
/// once; every fork gets its own sandbox and its own outcome back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wave_wider_than_one_preparation_activity_runs_every_fork_in_its_own_sandbox() {
    let mesh = Mesh::start().await.expect("mesh starts");
    let src = tempfile::tempdir().unwrap();
    repo::create(src.path()).unwrap();
    let mut gw = Gateway::new(mesh.channel("gateway").await.unwrap());
    let forks = 130;
    let agent = r#"echo "$FORKYARD_FORK" > which.txt"#;
    let run_id = gw
        .launch_run(LaunchRunRequest {
            budget_usd: "10".into(),
            ..launch(src.path(), forks, forks, agent)
        })
        .await
        .unwrap()
        .into_inner()
        .run_id;
    let run = wait_finished(&mut gw, &run_id, Duration::from_secs(600)).await;
    assert_eq!(run.forks_succeeded, forks, "{run:#?}");
    let sandboxes: std::collections::HashSet<&str> =
        run.forks.iter().map(|f| f.sandbox_id.as_str()).collect();
    assert_eq!(sandboxes.len(), forks as usize, "one sandbox per fork");
    assert!(run.forks.iter().all(|f| f.sandbox_ready_unix_ms > 0));
    // Each fork's patch is its own agent's work, on both sides of the 100-fork boundary.
    for fork in [1, 100, 101, forks] {
        let r = fork_result(&mut gw, &run_id, fork).await;
        assert!(
            r.patch.contains(&format!("+{fork}\n")),
            "fork {fork}: {}",
            r.patch
        );
    }
    let mut ledger = BudgetLedgerClient::new(mesh.channel("budget-ledger").await.unwrap());
    let account = run_account(&mut ledger, &run_id).await;
    assert_eq!(account.reserved_micros, 0, "{account:#?}");
    assert_eq!(account.spent_micros, run.cost_micros);
    assert!(
        sandbox_processes(mesh.state_dir()).is_empty(),
        "{:?}",
        sandbox_processes(mesh.state_dir())
    );
}

/// ListRuns agrees, by state and in its summaries.
async fn assert_list_runs_by_state(gw: &Gateway, failing: &str, fine: &str) {
    let list = |state: RunState| {
        let mut gw = gw.clone();
        async move {
            gw.list_runs(ListRunsRequest {
                state: state as i32,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner()
            .runs
        }
    };
    let mut failed = Vec::new();
    for _ in 0..50 {
        // Visibility follows the close by a moment.
        failed = list(RunState::Failed).await;
        if !failed.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        failed.iter().map(|r| r.run_id.as_str()).collect::<Vec<_>>(),
        [failing]
    );
    assert_eq!(failed[0].state, RunState::Failed as i32);
    let completed = list(RunState::Completed).await;
    assert_eq!(
        completed
            .iter()
            .map(|r| r.run_id.as_str())
            .collect::<Vec<_>>(),
        [fine]
    );
}

/// `forkyard watch` exits 3 for a failed run, 2 for one with some forks failed.
fn assert_watch_exit_codes(mesh: &Mesh, failing: &str, fine: &str) {
    for (run_id, code) in [(failing, 3), (fine, 2)] {
        let out = std::process::Command::new(forkyard_tests::mesh::bin_dir().join("forkyard"))
            .args([
                "--gateway",
                &mesh.endpoint("gateway"),
                "-o",
                "json",
                "watch",
                run_id,
            ])
            .output()
            .unwrap();
        assert_eq!(
            out.status.code(),
            Some(code),
            "{run_id}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_in_which_no_fork_succeeds_is_failed_with_the_reason() {
    let mesh = Mesh::start().await.expect("mesh starts");
    let src = tempfile::tempdir().unwrap();
    repo::create(src.path()).unwrap();
    let mut gw = Gateway::new(mesh.channel("gateway").await.unwrap());
    let failing = gw
        .launch_run(LaunchRunRequest {
            request_id: "all-fail".into(),
            ..launch(src.path(), 2, 2, "echo broken >&2; exit 3")
        })
        .await
        .unwrap()
        .into_inner()
        .run_id;
    let fine = gw
        .launch_run(LaunchRunRequest {
            request_id: "one-fine".into(),
            ..launch(
                src.path(),
                2,
                2,
                "[ \"$FORKYARD_FORK\" = 1 ] && echo ok >> README.md",
            )
        })
        .await
        .unwrap()
        .into_inner()
        .run_id;
    let run = wait_finished(&mut gw, &failing, Duration::from_secs(90)).await;
    assert_eq!(run.state, RunState::Failed as i32, "{run:#?}");
    assert!(
        run.error.starts_with("no fork succeeded (2 forks); fork "),
        "{}",
        run.error
    );
    let other = wait_finished(&mut gw, &fine, Duration::from_secs(90)).await;
    assert_eq!(
        other.state,
        RunState::Completed as i32,
        "one of two succeeded: {other:#?}"
    );
    assert_list_runs_by_state(&gw, &failing, &fine).await;
    assert_watch_exit_codes(&mesh, &failing, &fine);
}
