//! Plain-text output for people; `-o json` is for scripts.

use forkyard_proto::{
    common::v1::{ForkResult, ForkStatus, VerifyStatus},
    gateway::v1::{Run, RunEvent, RunState, RunSummary, run_event::Kind},
};
use std::fmt::Write;

/// An amount for a table's column: always six decimals, so columns line up.
pub fn usd(micros: i64) -> String {
    format!("{:#}", forkyard_proto::Usd::from_micros(micros))
}

fn secs(ms: i64) -> String {
    if ms <= 0 {
        "-".into()
    } else {
        format!("{:.1}s", ms as f64 / 1000.0)
    }
}

pub fn fork_status(status: i32) -> &'static str {
    match ForkStatus::try_from(status).unwrap_or_default() {
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

fn verify(v: i32) -> &'static str {
    match VerifyStatus::try_from(v).unwrap_or_default() {
        VerifyStatus::Passed => "passed",
        VerifyStatus::Failed => "failed",
        VerifyStatus::TimedOut => "timed-out",
        VerifyStatus::NotRun | VerifyStatus::Unspecified => "-",
    }
}

pub fn run_state(s: i32) -> &'static str {
    match RunState::try_from(s).unwrap_or_default() {
        RunState::Running => "running",
        RunState::Paused => "paused",
        RunState::AwaitingBudget => "awaiting-budget",
        RunState::Completed => "completed",
        RunState::Failed => "failed",
        RunState::Cancelled => "cancelled",
        RunState::Terminated => "terminated",
        RunState::TimedOut => "timed-out",
        RunState::Unspecified => "unknown",
    }
}

pub fn diffstat(f: &ForkResult) -> String {
    f.diffstat.map_or_else(
        || "-".to_owned(),
        |d| {
            let s = if d.files_changed == 1 { "" } else { "s" };
            format!(
                "{} file{s} +{} -{}",
                d.files_changed, d.insertions, d.deletions
            )
        },
    )
}

pub fn run(run: &Run) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "run {}  {}  forks {} ({} succeeded)  cost {} of {}",
        run.run_id,
        run_state(run.state),
        run.forks.len(),
        run.forks_succeeded,
        usd(run.cost_micros),
        usd(run.budget_micros)
    );
    let verifies = run
        .spec
        .as_ref()
        .is_some_and(|s| !s.verify_command.is_empty());
    // Fork trees: a PARENT column once the run has branches (`<parent>` and the depth).
    let tree = run.forks.iter().any(|f| f.parent_fork > 0);
    let _ = writeln!(
        out,
        "{:<5} {:<16} {:<7} {:>9} {:>10}  {:<22} {:<9} {}BRANCH / ERROR",
        "FORK",
        "STATUS",
        "BACKEND",
        "DURATION",
        "COST",
        "DIFFSTAT",
        "VERIFY",
        if tree { "PARENT    " } else { "" }
    );
    for f in &run.forks {
        let mark = if run.winner == f.fork { '*' } else { ' ' };
        let _ = writeln!(out, "{}", fork_row(f, mark, verifies, tree));
    }
    if run.winner > 0 {
        let _ = writeln!(
            out,
            "winner: fork {} (* above); ranking {:?}",
            run.winner, run.ranking
        );
    }
    if let Some(search) = run.spec.as_ref().and_then(|s| s.search.as_ref()) {
        let end = if run.search_end.is_empty() {
            String::new()
        } else {
            format!(" (ended early: {})", run.search_end)
        };
        let _ = writeln!(
            out,
            "search: round {} of {}, keeping {} with {} branches each{end}",
            run.search_round, search.rounds, search.keep, search.branches
        );
    }
    if run.branchable_until_unix_ms > 0 {
        let _ = writeln!(
            out,
            "open for branches until {} (forkyard branch / continue)",
            crate::when::at(run.branchable_until_unix_ms)
        );
    }
    if !run.error.is_empty() {
        let _ = writeln!(out, "error: {}", run.error);
    }
    out
}

/// One fork's row of [`run`]'s table; `mark` is `*` for the winner.
fn fork_row(f: &ForkResult, mark: char, verifies: bool, tree: bool) -> String {
    let duration = if f.finished_unix_ms > 0 {
        f.finished_unix_ms - f.started_unix_ms
    } else {
        0
    };
    let note = match (&f.error, &f.delivered) {
        (e, _) if !e.is_empty() => e.lines().next().unwrap_or("").to_owned(),
        (_, Some(d)) => delivered(d),
        (_, None) => f.branch.clone(),
    };
    let backend = if f.backend.is_empty() {
        "-"
    } else {
        &f.backend
    };
    format!(
        "{:<4}{mark} {:<16} {:<7} {:>9} {:>10}  {:<22} {:<9} {}{}",
        f.fork,
        fork_status(f.status),
        backend,
        secs(duration),
        usd(f.cost_micros),
        diffstat(f),
        if verifies { verify(f.verify) } else { "-" },
        if tree { parent_cell(f) } else { String::new() },
        note
    )
}

/// A fork's PARENT cell: `3 (d1)` for a branch of fork 3 at its end, `3@t4 (d1)` for
/// one taken while fork 3 ran, after its 4th model turn; `-` for one of the run's own.
fn parent_cell(f: &ForkResult) -> String {
    let cell = match (f.parent_fork, f.branch_turn) {
        (0, _) => "-".to_owned(),
        (p, 0) => format!("{p} (d{})", f.depth),
        (p, t) => format!("{p}@t{t} (d{})", f.depth),
    };
    format!("{cell:<10}")
}

/// The runs listed; a TENANT column once they span tenants (an admin's listing).
pub fn runs(runs: &[RunSummary]) -> String {
    let tenants = runs.iter().any(|r| r.tenant != runs[0].tenant);
    let tenant = |t: &str| {
        if tenants {
            format!("{t:<20} ")
        } else {
            String::new()
        }
    };
    let mut out = format!(
        "{:<44} {}{:<16} {}\n",
        "RUN",
        tenant("TENANT"),
        "STATE",
        "STARTED"
    );
    for r in runs {
        let _ = writeln!(
            out,
            "{:<44} {}{:<16} {}",
            r.run_id,
            tenant(&r.tenant),
            run_state(r.state),
            crate::when::at(r.started_unix_ms)
        );
    }
    out
}

pub fn fork(f: &ForkResult) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "fork {}  {}  backend {}  branch {}  base {}",
        f.fork,
        fork_status(f.status),
        if f.backend.is_empty() {
            "-"
        } else {
            &f.backend
        },
        f.branch,
        f.base_commit
    );
    let _ = writeln!(
        out,
        "cost {}  tokens in {} out {}  agent {} (exit {})  verify {} (exit {})",
        usd(f.cost_micros),
        f.usage.map_or(0, |u| u.input_tokens),
        f.usage.map_or(0, |u| u.output_tokens),
        secs(f.agent_duration_ms as i64),
        f.agent_exit_code,
        verify(f.verify),
        f.verify_exit_code
    );
    if !f.error.is_empty() {
        let _ = writeln!(out, "error: {}", f.error);
    }
    if let Some(d) = &f.delivered {
        let _ = writeln!(out, "delivered: {} ({})", delivered(d), d.remote);
    }
    let _ = writeln!(
        out,
        "--- agent output (tail) ---\n{}",
        f.agent_output_tail.trim_end()
    );
    if !f.verify_output_tail.is_empty() {
        let _ = writeln!(
            out,
            "--- verify output (tail) ---\n{}",
            f.verify_output_tail.trim_end()
        );
    }
    let truncated = if f.patch_truncated {
        " (truncated)"
    } else {
        ""
    };
    let _ = writeln!(
        out,
        "--- patch: {}, {} bytes{truncated} ---\n{}",
        diffstat(f),
        f.patch_bytes,
        f.patch.trim_end()
    );
    out
}

/// `fork <n>: <where it went>` for `forkyard publish`.
pub fn delivered_line(f: &ForkResult) -> String {
    match &f.delivered {
        Some(d) => format!("fork {}: {} ({})", f.fork, delivered(d), d.remote),
        None => format!("fork {}: not delivered", f.fork),
    }
}

/// Where a fork went: its pushed branch and commit and its pull request, or why not.
fn delivered(d: &forkyard_proto::common::v1::Delivered) -> String {
    let short = d.commit.get(..12).unwrap_or(&d.commit);
    match (d.commit.is_empty(), d.error.is_empty()) {
        (true, _) => format!("{}: not pushed: {}", d.branch, d.error),
        (false, true) if d.pull_request_url.is_empty() => format!("pushed {} @ {short}", d.branch),
        (false, true) => format!("pushed {} @ {short}, {}", d.branch, d.pull_request_url),
        (false, false) => format!("pushed {} @ {short}; {}", d.branch, d.error),
    }
}

/// One line per event, for logs and pipes.
pub fn event_line(e: &RunEvent) -> String {
    let f = e.fork_result.as_ref();
    match Kind::try_from(e.kind).unwrap_or_default() {
        Kind::ForkStarted => format!("fork {} started", e.fork),
        Kind::SandboxReady => format!(
            "fork {} sandbox ready ({})",
            e.fork,
            f.map_or("", |f| f.sandbox_id.as_str())
        ),
        Kind::AgentProgress => format!(
            "fork {} agent {:.1}s turns {} cost {} {}",
            e.fork,
            e.agent_elapsed_ms as f64 / 1000.0,
            e.agent_turns,
            usd(e.agent_cost_micros),
            e.agent_last_action
        ),
        Kind::ForkFinished => format!(
            "fork {} {} cost {} {}",
            e.fork,
            f.map_or("", |f| fork_status(f.status)),
            usd(f.map_or(0, |f| f.cost_micros)),
            f.map(diffstat).unwrap_or_default()
        ),
        // A raise changes the budget and maybe no state: both are said.
        Kind::RunStateChanged => match &e.run {
            Some(r) => format!("run {} budget {}", run_state(e.state), usd(r.budget_micros)),
            None => format!("run {}", run_state(e.state)),
        },
        Kind::RunFinished => format!("run finished: {}", run_state(e.state)),
        Kind::Snapshot | Kind::Unspecified => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `forkyard status`: each fork's backend in its own column ("-" before it has a
    /// sandbox), and on `forkyard result`'s first line.
    #[test]
    fn status_shows_each_forks_backend() {
        let fork = |n: u32, backend: &str| ForkResult {
            fork: n,
            status: ForkStatus::Succeeded as i32,
            backend: backend.into(),
            branch: format!("forkyard-fork-{n}"),
            ..Default::default()
        };
        let out = run(&Run {
            run_id: "run-1".into(),
            forks: vec![fork(1, "e2b"), fork(2, "local"), fork(3, "")],
            ..Default::default()
        });
        let lines: Vec<&str> = out.lines().collect();
        assert!(lines[1].contains(" BACKEND "), "{out}");
        let column = lines[1].find("BACKEND").unwrap();
        for (line, want) in lines[2..5].iter().zip(["e2b", "local", "-"]) {
            assert_eq!(
                line[column..].split_whitespace().next(),
                Some(want),
                "{out}"
            );
        }
        assert!(super::fork(&fork(1, "e2b")).starts_with("fork 1  succeeded  backend e2b "));
    }

    /// `forkyard status` of a tree: where each branch came from, and when a running
    /// parent was branched, after which of its turns.
    #[test]
    fn the_parent_column_names_the_parent_and_a_running_parents_turn() {
        let f = |parent_fork, depth, branch_turn| ForkResult {
            parent_fork,
            depth,
            branch_turn,
            ..Default::default()
        };
        assert_eq!(parent_cell(&f(0, 0, 0)).trim_end(), "-");
        assert_eq!(parent_cell(&f(3, 1, 0)).trim_end(), "3 (d1)");
        assert_eq!(parent_cell(&f(3, 2, 4)).trim_end(), "3@t4 (d2)");
    }
}
