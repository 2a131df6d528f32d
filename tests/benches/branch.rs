//! Branching a finished fork (#45's goal: into 10 ready sandboxes, p50 under 100 ms from
//! the update to the last sandbox ready), on the mesh of release binaries with a trivial
//! command agent.
//!
//! A run of one fork, open for branches, finishes its fork; then, round after round,
//! `BranchFork(fork 1, count)` and the time from the call to the last child's sandbox
//! ready (`sandbox_ready_unix_ms`, stamped by the workflow when its create answered), and
//! to the update's answer. Each round waits for its children to finish before the next.
//! Settings: `FORKYARD_BENCH_BRANCH_ROUNDS` (default 10), `FORKYARD_BENCH_BRANCH_COUNT`
//! (default 10).

use forkyard_proto::{
    common::v1::ForkStatus,
    gateway::v1::{BranchForkRequest, LaunchRunRequest},
};
use forkyard_tests::{
    Mesh, repo,
    support::{Gateway, launch, wait_until},
};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

const AGENT: &str = "echo branched > branched.txt";

fn env_num(name: &str, default: u32) -> u32 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(default)
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

fn percentile(sorted: &[i64], p: f64) -> i64 {
    let i = ((sorted.len().max(1) - 1) as f64 * p).round() as usize;
    sorted.get(i).copied().unwrap_or_default()
}

/// One round: (update answered, last child ready), in ms after the call.
async fn round(gw: &mut Gateway, run_id: &str, count: u32) -> anyhow::Result<(i64, i64)> {
    let asked = now_ms();
    let made = gw
        .branch_fork(BranchForkRequest {
            run_id: run_id.into(),
            fork: 1,
            count,
            prompt: String::new(),
        })
        .await?
        .into_inner();
    let answered = now_ms() - asked;
    let forks = made.forks.clone();
    let run = wait_until(gw, run_id, Duration::from_secs(300), |r| {
        forks.iter().all(|n| {
            r.forks.get(*n as usize - 1).is_some_and(|f| {
                f.sandbox_ready_unix_ms > 0
                    && ![ForkStatus::Pending as i32, ForkStatus::Running as i32].contains(&f.status)
            })
        })
    })
    .await;
    let children: Vec<_> = made
        .forks
        .iter()
        .map(|n| &run.forks[*n as usize - 1])
        .collect();
    let last_ready = children
        .iter()
        .map(|f| f.sandbox_ready_unix_ms)
        .max()
        .unwrap_or(asked);
    // Where the time goes: the first child started (its wave began), and a child's own
    // create (start to ready), the slowest.
    let first_start = children
        .iter()
        .map(|f| f.started_unix_ms)
        .min()
        .unwrap_or(asked);
    let create = children
        .iter()
        .map(|f| f.sandbox_ready_unix_ms - f.started_unix_ms)
        .max()
        .unwrap_or_default();
    println!(
        "    first child started {:>5} ms after the call; slowest start -> ready {create:>5} ms",
        first_start - asked
    );
    Ok((answered, last_ready - asked))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let rounds = env_num("FORKYARD_BENCH_BRANCH_ROUNDS", 10);
    let count = env_num("FORKYARD_BENCH_BRANCH_COUNT", 10);
    let mesh = Mesh::start().await?;
    let src = tempfile::tempdir()?;
    repo::create(src.path())?;
    let mut gw = Gateway::new(mesh.channel("gateway").await?);
    let run_id = gw
        .launch_run(LaunchRunRequest {
            branch_window_secs: 600,
            // Each branch reserves a fork's budget ($10: the run's shared by the 10 it
            // may run at once), as any fork does.
            budget_usd: "100".into(),
            ..launch(src.path(), 1, count, AGENT)
        })
        .await?
        .into_inner()
        .run_id;
    wait_until(&mut gw, &run_id, Duration::from_secs(120), |r| {
        r.branchable_until_unix_ms > 0
    })
    .await;
    println!(
        "branch benchmark: BranchFork of a finished fork into {count}, {rounds} rounds, release binaries"
    );
    let (mut answered, mut ready) = (Vec::new(), Vec::new());
    for i in 0..rounds {
        let (a, r) = round(&mut gw, &run_id, count).await?;
        println!(
            "  round {:>2}: update answered {a:>5} ms, last of {count} ready {r:>5} ms",
            i + 1
        );
        answered.push(a);
        ready.push(r);
    }
    answered.sort_unstable();
    ready.sort_unstable();
    println!(
        "update answered p50 {} ms, max {} ms; last sandbox ready p50 {} ms, max {} ms (goal: p50 < 100 ms)",
        percentile(&answered, 0.5),
        answered.last().copied().unwrap_or_default(),
        percentile(&ready, 0.5),
        ready.last().copied().unwrap_or_default(),
    );
    Ok(())
}
