//! Plain-text tables for people; `-o json` is for scripts.

use forkyard_proto::{
    common::v1::{ForkResult, ForkStatus},
    gateway::v1::{Run, RunState, RunSummary},
};
use std::fmt::Write;

fn usd(micros: i64) -> String {
    format!("${}.{:06}", micros / 1_000_000, (micros % 1_000_000).abs())
}

fn secs(ms: i64) -> String {
    if ms <= 0 {
        "-".into()
    } else {
        format!("{:.1}s", ms as f64 / 1000.0)
    }
}

fn fork_status(f: &ForkResult) -> &'static str {
    match ForkStatus::try_from(f.status).unwrap_or_default() {
        ForkStatus::Pending => "pending",
        ForkStatus::Running => "running",
        ForkStatus::Succeeded => "succeeded",
        ForkStatus::Failed => "failed",
        ForkStatus::Cancelled => "cancelled",
        ForkStatus::BudgetExceeded => "budget-exceeded",
        ForkStatus::TimedOut => "timed-out",
        ForkStatus::Unspecified => "unknown",
    }
}

pub fn run_state(s: i32) -> &'static str {
    match RunState::try_from(s).unwrap_or_default() {
        RunState::Running => "running",
        RunState::Completed => "completed",
        RunState::Failed => "failed",
        RunState::Cancelled => "cancelled",
        RunState::Terminated => "terminated",
        RunState::TimedOut => "timed-out",
        RunState::Unspecified => "unknown",
    }
}

pub fn run(run: &Run) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "run {}  {}  forks {} ({} succeeded)  cost {}",
        run.run_id,
        run_state(run.state),
        run.forks.len(),
        run.forks_succeeded,
        usd(run.cost_micros)
    );
    let _ = writeln!(
        out,
        "{:<5} {:<16} {:>9} {:>10}  {:<28} BRANCH / ERROR",
        "FORK", "STATUS", "DURATION", "COST", "DIFFSTAT"
    );
    for f in &run.forks {
        let duration = if f.finished_unix_ms > 0 {
            f.finished_unix_ms - f.started_unix_ms
        } else {
            0
        };
        let diffstat = f.diffstat.map_or_else(
            || "-".to_owned(),
            |d| {
                format!(
                    "{} file{} +{} -{}",
                    d.files_changed,
                    if d.files_changed == 1 { "" } else { "s" },
                    d.insertions,
                    d.deletions
                )
            },
        );
        let note = if f.error.is_empty() {
            f.branch.clone()
        } else {
            f.error.lines().next().unwrap_or("").to_owned()
        };
        let _ = writeln!(
            out,
            "{:<5} {:<16} {:>9} {:>10}  {:<28} {}",
            f.fork,
            fork_status(f),
            secs(duration),
            usd(f.cost_micros),
            diffstat,
            note
        );
    }
    if !run.error.is_empty() {
        let _ = writeln!(out, "error: {}", run.error);
    }
    out
}

pub fn runs(runs: &[RunSummary]) -> String {
    let mut out = format!("{:<44} {:<11} {}\n", "RUN", "STATE", "STARTED (unix ms)");
    for r in runs {
        let _ = writeln!(
            out,
            "{:<44} {:<11} {}",
            r.run_id,
            run_state(r.state),
            r.started_unix_ms
        );
    }
    out
}
