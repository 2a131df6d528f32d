//! What the run shows of itself: its live state, its ranking and winner, the `Run`
//! snapshot queries and the workflow's result carry, and how a finished run ended.

use super::SandboxOrchestrationWorkflow;
use forkyard_proto::{
    common::v1::{ForkResult, ForkStatus, VerifyStatus},
    gateway::v1::{Run, RunState},
};

impl SandboxOrchestrationWorkflow {
    pub(in crate::workflows) fn live_state(&self) -> RunState {
        if self.awaiting_budget {
            RunState::AwaitingBudget
        } else if self.paused {
            RunState::Paused
        } else {
            RunState::Running
        }
    }

    /// Best first: verified, then cheaper, then smaller patch (then fork number).
    pub(in crate::workflows) fn ranking(&self) -> Vec<u32> {
        let mut ranked: Vec<&ForkResult> = self
            .forks
            .iter()
            .filter(|f| f.status == ForkStatus::Succeeded as i32)
            .collect();
        ranked.sort_by_key(|f| {
            (
                f.verify != VerifyStatus::Passed as i32,
                f.cost_micros,
                f.patch_bytes,
                f.fork,
            )
        });
        ranked.into_iter().map(|f| f.fork).collect()
    }

    pub(in crate::workflows) fn snapshot(&self) -> Run {
        let count =
            |st: ForkStatus| self.forks.iter().filter(|f| f.status == st as i32).count() as u32;
        let ranking = self.ranking();
        // With a verify command only a verified fork can win.
        let winner = ranking
            .first()
            .copied()
            .filter(|w| {
                self.spec.verify_command.trim().is_empty()
                    || self.forks[(*w - 1) as usize].verify == VerifyStatus::Passed as i32
            })
            .unwrap_or(0);
        let (running, pending, succeeded) = (
            count(ForkStatus::Running),
            count(ForkStatus::Pending),
            count(ForkStatus::Succeeded),
        );
        Run {
            state: self.live_state() as i32,
            spec: Some(self.spec.clone()),
            forks: self.forks.clone(),
            cost_micros: self.forks.iter().map(|f| f.cost_micros).sum(),
            forks_succeeded: succeeded,
            forks_failed: self.forks.len() as u32 - succeeded - running - pending,
            forks_running: running,
            forks_pending: pending,
            started_unix_ms: self.started_unix_ms,
            finished_unix_ms: self.finished_unix_ms,
            error: self.error.clone(),
            budget_micros: self.budget_micros,
            ranking,
            winner,
            branchable_until_unix_ms: self.branchable_until_unix_ms,
            search_round: self.search.round,
            search_end: self.search.ended.clone(),
            ..Default::default()
        }
    }
}

/// How a run whose workflow completed ended: FAILED, with the reason, when it had forks
/// and none succeeded (every one failed, timed out, ran out of budget or was cancelled);
/// COMPLETED otherwise. A cancelled run is CANCELLED by its workflow's own status.
pub fn outcome(run: &Run) -> (RunState, String) {
    if run.forks.is_empty() || run.forks_succeeded > 0 {
        return (RunState::Completed, String::new());
    }
    let first = run
        .forks
        .iter()
        .find(|f| !f.error.is_empty())
        .map(|f| format!("; fork {}: {}", f.fork, f.error))
        .unwrap_or_default();
    (
        RunState::Failed,
        format!("no fork succeeded ({} forks){first}", run.forks.len()),
    )
}
