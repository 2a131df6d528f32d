//! End to end: a run of 1,000 forks (the gateway's default `--max-forks`) with a trivial
//! agent, through the gateway as a user launches one: every fork succeeds, the ledger
//! holds exactly what the agents reported, nothing of any sandbox is left on the host,
//! and the run's history stays within Temporal's limits. The benchmark
//! (`make bench-fanout`) measures how fast such a run goes; this test only that it
//! ends, whole and exact, within a bound. The full 1,000 (no reduced size): the run
//! takes 25-40 s on a 2-core machine, the test about 40 s with the mesh's start.
//! Each fork reports its own number as its cost, so a report lost or charged twice
//! shows in the sum (it found reports under $0.00001 read as no cost at all).

use forkyard_proto::{
    common::v1::ForkStatus,
    gateway::v1::{LaunchRunRequest, RunState},
};
use forkyard_tests::{
    Mesh, repo,
    support::{
        Gateway, Ledger, left_after_settling, run_account, sandbox_processes, wait_finished,
        workspaces_left,
    },
};
use std::time::{Duration, Instant};

const FORKS: u32 = 1000;
/// At most this many at once: what a 2-core machine runs without the forks' own
/// timeouts coming near, in debug builds beside the Temporal dev server.
const MAX_CONCURRENT: u32 = 50;

/// Fork n reports a cost of n micro-USD (the command driver reads `total_cost_usd` from
/// its last line), so the run's total is known without asking the mesh: 1 + 2 + … +
/// 1,000 = 500,500, and a fork charged twice or not at all shows in the sum.
const AGENT: &str = r#"printf '{"total_cost_usd": 0.%06d}\n' "$FORKYARD_FORK""#;
const TOTAL_MICROS: i64 = (FORKS as i64) * (FORKS as i64 + 1) / 2;

fn temporal_json(mesh: &Mesh, what: &str, run_id: &str) -> serde_json::Value {
    let out = std::process::Command::new(forkyard_tests::mesh::temporal_cli())
        .args(["workflow", what, "-o", "json", "--address"])
        .arg(mesh.temporal_address())
        .args(["-w", run_id])
        .output()
        .expect("temporal cli");
    serde_json::from_slice(&out.stdout).expect("temporal cli json")
}

/// The sandbox groups the mesh's provisioner still has, in every cgroup hierarchy of
/// this host (v1: one per controller).
fn sandbox_cgroups(state: &std::path::Path) -> Vec<String> {
    let parent =
        forkyard_sandbox_provisioner::local::isolation::cgroup::instance_parent("forkyard", state);
    let root = std::path::Path::new("/sys/fs/cgroup");
    std::fs::read_dir(root)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join(&parent))
        .chain([root.join(&parent)])
        .flat_map(|dir| std::fs::read_dir(dir).into_iter().flatten().flatten())
        .filter(|e| e.file_name().to_string_lossy().starts_with("sbx-") && e.path().is_dir())
        .map(|e| e.path().display().to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_of_1000_forks_succeeds_whole_with_an_exact_ledger_and_nothing_left() {
    let mesh = Mesh::start().await.expect("mesh");
    let src = tempfile::tempdir().unwrap();
    repo::create(src.path()).unwrap();
    let mut gw = Gateway::new(mesh.channel("gateway").await.unwrap());
    let mut ledger = Ledger::new(mesh.channel("budget-ledger").await.unwrap());
    let started = Instant::now();
    let launched = gw
        .launch_run(LaunchRunRequest {
            request_id: "e2e-thousand-forks".into(),
            // 2,000 micro-USD a fork: room for the largest report (1,000).
            budget_usd: "2".into(),
            ..forkyard_tests::support::launch(src.path(), FORKS, MAX_CONCURRENT, AGENT)
        })
        .await
        .expect("launch")
        .into_inner();
    // While the run goes, the probes of what is left must see its sandboxes' workspaces
    // and groups at least once: a probe looking in the wrong place would find nothing
    // left at the end whatever was left.
    let state = mesh.state_dir().to_path_buf();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let seen = {
        let (state, stop) = (state.clone(), stop.clone());
        tokio::task::spawn_blocking(move || {
            let (mut workspaces, mut groups) = (0, 0);
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                workspaces = workspaces.max(workspaces_left(&state).len());
                groups = groups.max(sandbox_cgroups(&state).len());
                std::thread::sleep(Duration::from_millis(100));
            }
            (workspaces, groups)
        })
    };
    // The bound: a run that stalls fails here rather than at the harness's timeout
    // (nextest's for the mesh tests is 300 s; the run takes 25-40 s on 2 cores).
    let run = wait_finished(&mut gw, &launched.run_id, Duration::from_secs(240)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (most_workspaces, most_groups) = seen.await.unwrap();
    println!(
        "{FORKS} forks, {MAX_CONCURRENT} at once: finished in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    assert_eq!(run.state, RunState::Completed as i32, "{}", run.error);
    assert_eq!(
        (run.forks_succeeded, run.forks_failed),
        (FORKS, 0),
        "{}",
        run.error
    );
    assert_eq!(run.forks.len(), FORKS as usize);
    let wrong: Vec<String> = run
        .forks
        .iter()
        .enumerate()
        .filter(|(i, f)| {
            f.fork != *i as u32 + 1
                || f.status != ForkStatus::Succeeded as i32
                || f.cost_micros != i64::from(f.fork)
        })
        .map(|(_, f)| {
            format!(
                "fork {}: {:?}, {} micro-USD, {}",
                f.fork,
                ForkStatus::try_from(f.status),
                f.cost_micros,
                f.error
            )
        })
        .take(10)
        .collect();
    assert!(
        wrong.is_empty(),
        "forks not succeeded at their own cost: {wrong:#?}"
    );

    // The ledger, against the sum the agents reported (not the run's own figure).
    let account = run_account(&mut ledger, &launched.run_id).await;
    assert_eq!(account.spent_micros, TOTAL_MICROS, "{account:#?}");
    assert_eq!(account.reserved_micros, 0, "{account:#?}");
    assert_eq!(run.cost_micros, TOTAL_MICROS);

    // Nothing of any sandbox on the host: workspaces, processes, cgroups.
    assert!(
        most_workspaces > 0 && most_groups > 0,
        "the probes never saw a sandbox while the run went ({most_workspaces} workspaces, \
         {most_groups} cgroups at most): they look in the wrong place"
    );
    println!("at most {most_workspaces} workspaces and {most_groups} sandbox cgroups at once");
    let state = state.as_path();
    let workspaces = left_after_settling(|| workspaces_left(state)).await;
    assert!(workspaces.is_empty(), "workspaces left: {workspaces:?}");
    let processes = left_after_settling(|| sandbox_processes(state)).await;
    assert!(
        processes.is_empty(),
        "sandbox processes left: {processes:?}"
    );
    let groups = left_after_settling(|| sandbox_cgroups(state)).await;
    assert!(groups.is_empty(), "sandbox cgroups left: {groups:?}");

    // The run's history, below Temporal's warnings (10,240 events, 10 MiB; its limits
    // are 51,200 and 50 MiB): the forks ran inline, no child workflow each.
    let described = temporal_json(&mesh, "describe", &launched.run_id);
    let info = &described["workflowExecutionInfo"];
    let events: u64 = info["historyLength"].as_str().unwrap().parse().unwrap();
    let bytes: u64 = info["historySizeBytes"].as_str().unwrap().parse().unwrap();
    println!("history: {events} events, {bytes} bytes");
    assert!(events < 10_240, "{events} events");
    assert!(bytes < 10 << 20, "{bytes} bytes of history");
    let history = temporal_json(&mesh, "show", &launched.run_id);
    let children = history["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| {
            e.get("startChildWorkflowExecutionInitiatedEventAttributes")
                .is_some()
        })
        .count();
    assert_eq!(children, 0, "forks ran inline");
}
