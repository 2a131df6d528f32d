//! Settling and destroying as steps of whichever workflow runs them: a sandbox's destroy
//! and a settlement posted durably (a child's fork, an inline fork whose ledger was
//! away), and the run's own give-backs for a fork that never got that far. What is
//! settled is the fork's rule (`crate::lifecycle::charge`).

use super::{
    failure::{StepFailure, classify, retryable},
    options,
    patches::{Change, Patches},
};
use crate::{
    activities::sandboxes::SandboxLocal,
    lifecycle::{AtOwner, charge::Settlement},
};
use forkyard_proto::{
    activities::Ledger,
    budget::v1::{ReleaseRequest, Reservation},
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
    destroy_at(ctx, at(sandbox, reason), lost).await
}

/// Destroy the sandbox `at` names, as [`destroy`] does.
pub(super) async fn destroy_at<W>(
    ctx: &WorkflowContext<W>,
    at: AtOwner,
    lost: bool,
) -> Result<DestroySandboxResponse, ActivityExecutionError> {
    let options = options::destroy_local(lost);
    ctx.execute_local_activity(SandboxLocal::destroy, at, options)
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

/// Post a settlement as a local activity. One the ledger did not take in time is posted
/// again until it does ([`Change::DurableSettle`]: runs from earlier builds reported such
/// forks FAILED and lost the spend).
pub(super) async fn settle<W>(
    ctx: &WorkflowContext<W>,
    patches: Patches,
    s: &Settlement,
) -> Result<Reservation, StepFailure> {
    let answer = if s.commit {
        let req = s.commit_request();
        ctx.execute_local_activity(Ledger::commit, req, options::ledger_detached())
            .await
    } else {
        let req = s.release_request();
        ctx.execute_local_activity(Ledger::release, req, options::ledger_detached())
            .await
    };
    match answer {
        Err(e) if retryable(&e) && patches.takes(ctx, Change::DurableSettle) => {
            settle_durably(ctx, s).await
        }
        a => a.map_err(|e| classify(s.step(), &e)),
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
