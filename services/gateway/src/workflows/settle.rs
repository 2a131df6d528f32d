//! A fork's last steps as local activities of whichever workflow runs them: settle its
//! reservation (commit what it spent, or release it) and destroy its sandbox; and the
//! run's own give-backs for a fork that never got that far.

use super::{
    failure::{StepFailure, classify, retryable},
    fork_result::apply_settlement,
    input::Progress,
    options,
    patches::{Change, Patches},
};
use crate::sandboxes::{AtOwner, SandboxLocal};
use forkyard_proto::{
    activities::Ledger,
    budget::v1::{CommitRequest, ReleaseRequest, Reservation},
    common::v1::{ForkResult, ForkStatus},
    sandbox::v1::{DestroySandboxResponse, Sandbox},
};
use temporalio_workflow::{WorkflowContext, common::error::ActivityExecutionError};

fn at(sandbox: &Sandbox, reason: &str) -> AtOwner {
    AtOwner {
        endpoint: sandbox.owner_endpoint.clone(),
        sandbox_id: sandbox.id.clone(),
        reason: reason.to_owned(),
    }
}

/// Destroy a sandbox at its owner replica, whatever the workflow's cancellation; tried
/// for minutes (an outage of its replica), or briefly when it is known `lost`.
pub(super) async fn destroy<W>(
    ctx: &WorkflowContext<W>,
    sandbox: &Sandbox,
    reason: &str,
    lost: bool,
) -> Result<DestroySandboxResponse, ActivityExecutionError> {
    let options = if lost {
        options::destroy_lost_local()
    } else {
        options::destroy_local()
    };
    ctx.execute_local_activity(SandboxLocal::destroy, at(sandbox, reason), options)
        .await
}

/// Give back a reservation nothing was charged to (best effort: the janitor releases
/// reservations whose holder has closed).
pub(super) async fn release<W>(ctx: &WorkflowContext<W>, key: &str, reservation_id: &str) {
    let release = ReleaseRequest {
        reservation_id: reservation_id.to_owned(),
        idempotency_key: key.to_owned(),
    };
    let _ = ctx
        .execute_local_activity(Ledger::release, release, options::ledger_detached())
        .await;
}

/// Commit what the agent spent, or release the reservation if it spent nothing. A
/// settlement the ledger did not take in time is posted again until it does
/// ([`Change::DurableSettle`]: runs from earlier builds reported such forks FAILED and
/// lost the spend).
pub(super) async fn settle<W>(
    ctx: &WorkflowContext<W>,
    key: &impl Fn(&str) -> String,
    progress: &Progress,
    patches: Patches,
    result: &mut ForkResult,
) {
    let reservation_id = progress.reservation_id.clone();
    let (amount, sandbox) = commit_amount(
        progress.cost_micros,
        progress.sandbox_charged_micros,
        progress.sandbox_cost_micros,
    );
    result.sandbox_cost_micros = sandbox;
    let commit = amount > 0 || result.status == ForkStatus::Succeeded as i32;
    let settlement = Settlement {
        commit,
        reservation_id,
        amount_micros: amount,
        key: key(if commit { "commit" } else { "release" }),
    };
    let answer = if commit {
        let req = settlement.commit_request();
        ctx.execute_local_activity(Ledger::commit, req, options::ledger_detached())
            .await
    } else {
        let req = settlement.release_request();
        ctx.execute_local_activity(Ledger::release, req, options::ledger_detached())
            .await
    };
    let answer = match answer {
        Err(e) if retryable(&e) && patches.takes(ctx, Change::DurableSettle) => {
            settle_durably(ctx, &settlement).await
        }
        a => a.map_err(|e| classify(settlement.step(), &e)),
    };
    apply_settlement(result, amount, commit, answer);
}

/// One fork's settlement: commit what it spent, or release the reservation.
pub(super) struct Settlement {
    pub commit: bool,
    pub reservation_id: String,
    pub amount_micros: i64,
    /// The idempotency key of the first try, so a durable retry posts it once.
    pub key: String,
}

impl Settlement {
    fn step(&self) -> &'static str {
        if self.commit {
            "commit spend"
        } else {
            "release reservation"
        }
    }

    fn commit_request(&self) -> CommitRequest {
        CommitRequest {
            reservation_id: self.reservation_id.clone(),
            amount_micros: self.amount_micros,
            idempotency_key: self.key.clone(),
        }
    }

    fn release_request(&self) -> ReleaseRequest {
        ReleaseRequest {
            reservation_id: self.reservation_id.clone(),
            idempotency_key: self.key.clone(),
        }
    }
}

/// The settlement as a regular activity on the ledger's queue, retried until the ledger
/// takes it ([`options::ledger_durable`]): the fork's result waits for it.
pub(super) async fn settle_durably<W>(
    ctx: &WorkflowContext<W>,
    s: &Settlement,
) -> Result<Reservation, StepFailure> {
    let answer = if s.commit {
        ctx.execute_activity(
            Ledger::commit,
            s.commit_request(),
            options::ledger_durable(),
        )
        .await
    } else {
        ctx.execute_activity(
            Ledger::release,
            s.release_request(),
            options::ledger_durable(),
        )
        .await
    };
    answer.map_err(|e| classify(s.step(), &e))
}

/// What a fork's commit posts, and the sandbox's part of it: the agent's spend (`cost`,
/// of which `sandbox_charged` was sandbox time charged while it ran) with the sandbox's
/// whole cost in place of that part, when it is known (read at patch collection, never
/// less than what was charged for it).
pub fn commit_amount(cost: i64, sandbox_charged: i64, sandbox_cost: Option<i64>) -> (i64, i64) {
    let sandbox = sandbox_cost.unwrap_or(0).max(sandbox_charged);
    (cost - sandbox_charged + sandbox, sandbox)
}
