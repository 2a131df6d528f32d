//! Fork throughput and launch overhead on the local stack (Temporal dev server + the five
//! release binaries), with a trivial command agent, at N = 10, 100, 1000 forks.
//!
//! Prints forks/s, p50/p99 of LaunchRun → sandbox ready and of fork start → sandbox
//! ready, the run's workflow history length, and each service's peak resident memory.
//! `make bench-fanout` builds the release binaries first. Sizes:
//! `FORKYARD_BENCH_SIZES=10,100` (default 10,100,1000); in-flight cap:
//! `FORKYARD_BENCH_CONCURRENCY` (default 100). `FORKYARD_BENCH_LOGS=<dir>`: the services'
//! logs are copied there at the end (the mesh's state directory goes with the run).
//! `FORKYARD_MESH_ENV='K=V …'`: settings given to every service (e.g.
//! `FORKYARD_WARM_COPIES_MIN=100`). `FORKYARD_BENCH_ISOLATION=gvisor`: every fork's
//! sandbox under gVisor (the run's `isolation`; empty, the default: bubblewrap).

use forkyard_proto::gateway::v1::{LaunchRunRequest, RunState};
use forkyard_tests::{
    Mesh, repo,
    support::{Gateway, launch, wait_finished},
};
use std::time::{Duration, Instant, SystemTime};

fn env_list(name: &str, default: &[u32]) -> Vec<u32> {
    std::env::var(name)
        .ok()
        .map(|v| v.split(',').filter_map(|x| x.trim().parse().ok()).collect())
        .unwrap_or_else(|| default.to_vec())
}

fn percentile(sorted: &[i64], p: f64) -> i64 {
    if sorted.is_empty() {
        return 0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn peak_rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// CPU time (user + system) a process has used so far, in seconds.
fn cpu_secs(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which may hold spaces) start at ") ".
    let rest = stat.rsplit_once(") ").map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // utime and stime are fields 14 and 15 of /proc/<pid>/stat (11 and 12 after the name).
    (ticks(11) + ticks(12)) / 100.0
}

/// CPU time the whole machine has spent busy so far (every process and the kernel: all of
/// `/proc/stat`'s first line but idle and iowait), in seconds.
fn machine_cpu_secs() -> f64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let ticks: Vec<f64> = stat
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .skip(1)
        .map(|v| v.parse().unwrap_or(0.0))
        .collect();
    // user nice system idle iowait irq softirq steal (guest time is inside user).
    let busy: f64 = ticks
        .iter()
        .take(8)
        .enumerate()
        .filter(|(i, _)| *i != 3 && *i != 4)
        .map(|(_, t)| t)
        .sum();
    busy / 100.0
}

/// `temporal workflow <what> -o json -w <run_id>` against the mesh's server, parsed.
fn workflow_json(mesh: &Mesh, what: &str, run_id: &str) -> Option<serde_json::Value> {
    let out = std::process::Command::new(forkyard_tests::mesh::temporal_cli())
        .args(["workflow", what, "-o", "json", "--address"])
        .arg(mesh.temporal_address())
        .args(["-w", run_id])
        .output()
        .ok()?;
    serde_json::from_slice(&out.stdout).ok()
}

fn history_length(mesh: &Mesh, run_id: &str) -> String {
    workflow_json(mesh, "describe", run_id)
        .and_then(|v| {
            v["workflowExecutionInfo"]["historyLength"]
                .as_str()
                .map(str::to_owned)
        })
        .unwrap_or_else(|| "?".into())
}

/// Workflow tasks of the run that failed or timed out, with why: a task held open by a
/// long local activity while events piled up is force-failed by the server past 100
/// buffered events (the hazard a wave's preparation must not run into), one the worker
/// did not answer in time times out (START_TO_CLOSE), and a sticky task nobody picked up
/// in time goes back to the normal queue (SCHEDULE_TO_START, harmless).
fn task_trouble(mesh: &Mesh, run_id: &str) -> String {
    let Some(history) = workflow_json(mesh, "show", run_id) else {
        return "?".into();
    };
    let mut trouble: std::collections::BTreeMap<String, usize> = Default::default();
    for e in history["events"].as_array().into_iter().flatten() {
        let why = if let Some(a) = e.get("workflowTaskFailedEventAttributes") {
            format!("failed {}", a["cause"].as_str().unwrap_or("?"))
        } else if let Some(a) = e.get("workflowTaskTimedOutEventAttributes") {
            format!("timed out {}", a["timeoutType"].as_str().unwrap_or("?"))
        } else {
            continue;
        };
        *trouble.entry(why).or_default() += 1;
    }
    if trouble.is_empty() {
        "none failed or timed out".into()
    } else {
        format!("{trouble:?}")
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let sizes = env_list("FORKYARD_BENCH_SIZES", &[10, 100, 1000]);
    let cap = env_list("FORKYARD_BENCH_CONCURRENCY", &[100])[0];
    let isolation = std::env::var("FORKYARD_BENCH_ISOLATION")
        .unwrap_or_default()
        .trim()
        .to_owned();
    let mesh = Mesh::start().await?;
    let src = tempfile::tempdir()?;
    repo::create(src.path())?;
    let mut gw = Gateway::new(mesh.channel("gateway").await?);

    println!(
        "fan-out benchmark: trivial command agent, max_concurrent = min(N, {cap}), isolation: {}, release binaries",
        if isolation.is_empty() {
            "bubblewrap (default)"
        } else {
            &isolation
        }
    );
    println!(
        "{:>6} {:>10} {:>9} {:>22} {:>22} {:>9}",
        "forks", "wall", "forks/s", "launch→ready p50/p99", "start→ready p50/p99", "history"
    );
    for n in sizes {
        let req = LaunchRunRequest {
            budget_usd: format!("{n}"),
            fork_timeout_secs: 60,
            isolation: isolation.clone(),
            ..launch(src.path(), n, n.min(cap), "true")
        };
        let launched_at = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)?
            .as_millis() as i64;
        let cpu0: Vec<f64> = mesh.pids().iter().map(|(_, p)| cpu_secs(*p)).collect();
        let machine0 = machine_cpu_secs();
        let t0 = Instant::now();
        let run_id = gw.launch_run(req).await?.into_inner().run_id;
        let run = wait_finished(&mut gw, &run_id, Duration::from_secs(3600)).await;
        // The run's own finish time (workflow time, the server's clock on this machine),
        // not the moment the 200 ms status poll saw it.
        let wall = match u64::try_from(run.finished_unix_ms - launched_at) {
            Ok(ms) if run.finished_unix_ms > 0 => Duration::from_millis(ms),
            _ => t0.elapsed(),
        };
        anyhow::ensure!(
            run.state == RunState::Completed as i32,
            "run {run_id} ended {:?}",
            run.state
        );
        let mut from_launch: Vec<i64> = run
            .forks
            .iter()
            .filter(|f| f.sandbox_ready_unix_ms > 0)
            .map(|f| f.sandbox_ready_unix_ms - launched_at)
            .collect();
        let mut from_start: Vec<i64> = run
            .forks
            .iter()
            .filter(|f| f.sandbox_ready_unix_ms > 0)
            .map(|f| f.sandbox_ready_unix_ms - f.started_unix_ms)
            .collect();
        from_launch.sort_unstable();
        from_start.sort_unstable();
        println!(
            "{:>6} {:>9.1}s {:>9.1} {:>22} {:>22} {:>9}",
            n,
            wall.as_secs_f64(),
            f64::from(n) / wall.as_secs_f64(),
            format!(
                "{} / {} ms",
                percentile(&from_launch, 0.5),
                percentile(&from_launch, 0.99)
            ),
            format!(
                "{} / {} ms",
                percentile(&from_start, 0.5),
                percentile(&from_start, 0.99)
            ),
            history_length(&mesh, &run_id),
        );
        let cpu: Vec<String> = mesh
            .pids()
            .iter()
            .zip(&cpu0)
            .map(|((name, pid), before)| {
                format!(
                    "{name} {:.1} ms",
                    (cpu_secs(*pid) - before) * 1000.0 / f64::from(n)
                )
            })
            .collect();
        let machine = (machine_cpu_secs() - machine0) * 1000.0 / f64::from(n);
        println!(
            "       CPU per fork: {}; machine {machine:.1} ms",
            cpu.join(", ")
        );
        println!("       workflow tasks: {}", task_trouble(&mesh, &run_id));
        anyhow::ensure!(
            run.forks_succeeded == n,
            "{} of {n} forks succeeded",
            run.forks_succeeded
        );
    }
    if let Some(dir) = std::env::var_os("FORKYARD_BENCH_LOGS") {
        std::fs::create_dir_all(&dir)?;
        for log in std::fs::read_dir(mesh.state_dir().join("logs"))? {
            let log = log?;
            std::fs::copy(log.path(), std::path::Path::new(&dir).join(log.file_name()))?;
        }
    }
    println!("peak resident memory (VmHWM):");
    for (name, pid) in mesh.pids() {
        println!("  {name:<20} {:>8} MiB", peak_rss_kib(pid) / 1024);
    }
    Ok(())
}
