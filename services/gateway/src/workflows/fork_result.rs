//! How a fork's steps fill in its `ForkResult`: its start, each step's outcome, its
//! settlement, how its last steps ended. Functions of what happened, shared by the run's
//! inline forks and the fork workflow.

use super::{
    failure::{StepFailure, failure_message},
    input::{AgentEnd, ForkInput},
    phase,
};
use crate::lifecycle::finish::Ended;
use forkyard_proto::{
    budget::v1::Reservation,
    common::v1::{ForkResult, ForkStatus, VerifyStatus},
    sandbox::v1::{CollectPatchResponse, Sandbox},
};

/// The fork's result as it starts its steps.
pub(super) fn starting(input: &ForkInput, sandbox: &Sandbox) -> ForkResult {
    ForkResult {
        fork: input.fork,
        status: ForkStatus::Running as i32,
        branch: forkyard_proto::ids::fork_branch(&input.spec.branch, input.fork),
        started_unix_ms: input.started_unix_ms,
        sandbox_ready_unix_ms: input.sandbox_ready_unix_ms,
        sandbox_id: sandbox.id.clone(),
        backend: sandbox.backend.clone(),
        base_commit: sandbox.base_commit.clone(),
        phase: phase::AGENT.into(),
        verify: VerifyStatus::NotRun as i32,
        parent_fork: input.branch.as_ref().map_or(0, |b| b.parent_fork),
        depth: input.branch.as_ref().map_or(0, |b| b.depth),
        branch_turn: input.branch.as_ref().map_or(0, |b| b.turn),
        ..Default::default()
    }
}

pub(super) fn apply_failure(result: &mut ForkResult, f: StepFailure) {
    let status = match &f {
        StepFailure::Cancelled => ForkStatus::Cancelled,
        StepFailure::BudgetExceeded(_) => ForkStatus::BudgetExceeded,
        // A fork waiting for room is pending in the run, never given a result (`run_loop`).
        StepFailure::SandboxLost(_) | StepFailure::Failed(_) | StepFailure::WaitsForRoom(_) => {
            ForkStatus::Failed
        }
    };
    result.status = status as i32;
    result.error = failure_message(f);
}

/// The patch's fields on the fork's result.
pub(super) fn apply_patch(result: &mut ForkResult, patch: CollectPatchResponse) {
    result.patch = patch.patch;
    result.patch_truncated = patch.truncated;
    result.patch_bytes = patch.patch_bytes;
    result.diffstat = Some(patch.diffstat.unwrap_or_default());
    result.patch_skipped_files = patch.skipped_files;
}

/// The fork's status from how its agent ended (its patch is in).
pub(super) fn apply_agent_end(result: &mut ForkResult, end: AgentEnd, timeout_secs: u32) {
    if end.timed_out {
        result.status = ForkStatus::TimedOut as i32;
        result.error = format!("agent did not finish within {timeout_secs} s");
    } else if end.over_disk_limit {
        result.status = ForkStatus::Failed as i32;
        result.error = "agent stopped: the workspace grew past the sandbox's disk limit".into();
    } else if end.exit_code != 0 {
        result.status = ForkStatus::Failed as i32;
        result.error = format!("agent exited with code {}", end.exit_code);
    } else {
        result.status = ForkStatus::Succeeded as i32;
    }
}

/// The fork's cost (and status) from its settlement: what was committed, or (released)
/// what the agent charged before it stopped, e.g. on budget exceeded, which stays spent.
pub(super) fn apply_settlement(
    result: &mut ForkResult,
    cost_micros: i64,
    committed: bool,
    answer: Result<Reservation, StepFailure>,
) {
    match (committed, answer) {
        (true, Ok(r)) => {
            result.cost_micros = r.committed_micros;
            if r.budget_exceeded {
                result.status = ForkStatus::BudgetExceeded as i32;
                result.error = format!(
                    "agent spent {cost_micros} micro-USD, more than the run's budget allowed ({} charged)",
                    r.committed_micros
                );
            }
        }
        (true, Err(e)) => {
            result.status = ForkStatus::Failed as i32;
            result.error = failure_message(e);
        }
        (false, Ok(r)) => {
            result.cost_micros = r.charged_micros;
            result.sandbox_cost_micros = result.sandbox_cost_micros.min(r.charged_micros);
        }
        (false, Err(e)) if result.error.is_empty() => result.error = failure_message(e),
        (false, Err(_)) => {}
    }
    // The sandbox's part is set before settling (0 until sandbox time is priced): the
    // rest of what the ledger took is the model's.
    result.model_cost_micros = (result.cost_micros - result.sandbox_cost_micros).max(0);
}

/// The fork's result once its last steps ended (`crate::lifecycle::finish`), at `now`:
/// how its agent ended with its patch (or why either failed), what its settlement
/// took, and why its sandbox stayed (the janitor's sweep reaps it once the fork's
/// workflow has closed).
pub(super) fn apply_ended(
    result: &mut ForkResult,
    agent: Result<AgentEnd, StepFailure>,
    ended: Ended<StepFailure>,
    timeout_secs: u32,
    now: i64,
) {
    match (agent, ended.patch) {
        (Err(why), _) | (Ok(_), Some(Err(why))) => apply_failure(result, why),
        (Ok(end), Some(Ok(patch))) => {
            apply_patch(result, patch);
            apply_agent_end(result, end, timeout_secs);
        }
        (Ok(_), None) => apply_failure(result, StepFailure::Failed("no patch collected".into())),
    }
    result.sandbox_cost_micros = ended.sandbox_cost_micros;
    // A snapshot that failed leaves the fork as it ended; BranchFork then says it has
    // no branch point.
    if let Some(Ok(id)) = ended.snapshot {
        result.snapshot_id = id;
    }
    let s = ended.settlement;
    apply_settlement(result, s.amount_micros, s.commit, ended.settled);
    if let Err(why) = ended.destroyed
        && result.error.is_empty()
    {
        result.error = failure_message(why);
    }
    result.phase = phase::DONE.into();
    result.finished_unix_ms = now;
}
