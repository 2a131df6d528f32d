//! A fork's first and last steps, shared by the run and the fork workflows.
//!
//! The run workflow prepares each fork itself before it starts the fork's child:
//! reserve budget → create sandbox → health check, all local activities (see
//! `crate::sandboxes` and `crate::ledger` for why). So the way from `LaunchRun` to a
//! ready sandbox holds no child-workflow start and no matched activity task, and the
//! child's history starts at the agent. What prepare made is never lost: reserve and
//! create run on a detached cancellation token, and a fork cancelled (or failed) before
//! its child started has its sandbox destroyed and its reservation released here.
//!
//! Settlement and destroy are the child's last steps (and the run's, for a fork that
//! never reached its child).

use super::{
    failure::{StepFailure, classify},
    fork::{ForkInput, Progress, failure_message},
    options,
    orchestration::SandboxOrchestrationWorkflow,
    phase,
};
use crate::sandboxes::{AtOwner, SandboxLocal};
use forkyard_proto::{
    activities::Ledger,
    budget::v1::{CommitRequest, ReleaseRequest, ReserveRequest},
    common::v1::{ForkResult, ForkStatus},
    labels,
    sandbox::v1::{CreateSandboxRequest, DestroySandboxResponse, Sandbox},
};
use std::collections::HashMap;
use temporalio_workflow::{
    WorkflowCancellationToken, WorkflowContext, common::error::ActivityExecutionError,
};

/// What prepare hands to the fork's child.
pub(super) struct Prepared {
    pub reservation_id: String,
    pub sandbox: Sandbox,
    pub ready_unix_ms: i64,
}

/// The idempotency key of a fork's step: `<run>/fork-<n>/a<attempt>/<step>` (the same
/// keys whichever workflow runs the step, so a retried step never applies twice).
pub(super) fn step_key(child_id: &str, attempt: u32, step: &str) -> String {
    format!("{child_id}/a{}/{step}", attempt.max(1))
}

/// Reserve, create and check one fork's sandbox. `cancel` is the fork's own token
/// (cancelled by CancelFork, an early stop or the run's cancellation).
pub(super) async fn prepare(
    ctx: &WorkflowContext<SandboxOrchestrationWorkflow>,
    input: &ForkInput,
    child_id: &str,
    cancel: &WorkflowCancellationToken,
) -> Result<Prepared, StepFailure> {
    let key = |step: &str| step_key(child_id, input.attempt, step);
    let phase_is = |p: &str| ctx.state_mut(|s| s.set_fork_phase(input.fork, p));
    let reserve = ReserveRequest {
        account_id: input.run_id.clone(),
        amount_micros: input.reservation_micros,
        holder: child_id.to_owned(),
        idempotency_key: key("reserve"),
    };
    let reservation_id = ctx
        .execute_local_activity(Ledger::reserve, reserve, options::ledger_detached())
        .await
        .map_err(|e| classify("reserve budget", &e))?
        .reservation_id;
    let give_up = async |sandbox: Option<&Sandbox>, why: StepFailure| {
        if let Some(sb) = sandbox {
            let _ = destroy(ctx, sb, "fork did not start").await;
        }
        release(ctx, &key("release"), &reservation_id).await;
        why
    };
    if cancel.is_cancelled() {
        return Err(give_up(None, StepFailure::Cancelled).await);
    }

    phase_is(phase::CREATING);
    let spec = &input.spec;
    let create = CreateSandboxRequest {
        backend: "local".into(),
        repo: spec.repo.clone(),
        base_ref: spec.base_ref.clone(),
        branch: format!("{}-fork-{}", spec.branch, input.fork),
        labels: HashMap::from([
            (labels::RUN_ID.to_owned(), input.run_id.clone()),
            (labels::FORK.to_owned(), input.fork.to_string()),
            // The child that will own it; until it starts, the janitor's min age
            // keeps the sandbox.
            (labels::WORKFLOW_ID.to_owned(), child_id.to_owned()),
        ]),
        idempotency_key: key("create"),
        network: false,
        ..Default::default()
    };
    let sandbox = match ctx
        .execute_local_activity(SandboxLocal::create, create, options::create_local())
        .await
    {
        Ok(sb) => sb,
        Err(e) => return Err(give_up(None, classify("create sandbox", &e)).await),
    };
    if cancel.is_cancelled() {
        return Err(give_up(Some(&sandbox), StepFailure::Cancelled).await);
    }

    phase_is(phase::CHECKING);
    let health = ctx
        .execute_local_activity(
            SandboxLocal::health,
            at(&sandbox, ""),
            options::health_local(cancel.clone()),
        )
        .await;
    let ready_unix_ms = match health {
        Ok(h) if h.healthy => h.checked_unix_ms,
        Ok(h) => {
            let why = StepFailure::Failed(format!("health check: {}", h.detail));
            return Err(give_up(Some(&sandbox), why).await);
        }
        Err(e) => return Err(give_up(Some(&sandbox), classify("health check", &e)).await),
    };
    if cancel.is_cancelled() {
        return Err(give_up(Some(&sandbox), StepFailure::Cancelled).await);
    }
    Ok(Prepared {
        reservation_id,
        sandbox,
        ready_unix_ms,
    })
}

fn at(sandbox: &Sandbox, reason: &str) -> AtOwner {
    AtOwner {
        endpoint: sandbox.owner_endpoint.clone(),
        sandbox_id: sandbox.id.clone(),
        reason: reason.to_owned(),
    }
}

/// Destroy a sandbox at its owner replica, whatever the workflow's cancellation.
pub(super) async fn destroy<W>(
    ctx: &WorkflowContext<W>,
    sandbox: &Sandbox,
    reason: &str,
) -> Result<DestroySandboxResponse, ActivityExecutionError> {
    ctx.execute_local_activity(
        SandboxLocal::destroy,
        at(sandbox, reason),
        options::destroy_local(),
    )
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

/// Commit what the agent spent, or release the reservation if it spent nothing.
pub(super) async fn settle<W>(
    ctx: &WorkflowContext<W>,
    key: &impl Fn(&str) -> String,
    progress: &Progress,
    result: &mut ForkResult,
) {
    let reservation_id = progress.reservation_id.clone();
    if progress.cost_micros > 0 || result.status == ForkStatus::Succeeded as i32 {
        let commit = CommitRequest {
            reservation_id,
            amount_micros: progress.cost_micros,
            idempotency_key: key("commit"),
        };
        match ctx
            .execute_local_activity(Ledger::commit, commit, options::ledger_detached())
            .await
        {
            Ok(r) => {
                result.cost_micros = r.committed_micros;
                if r.budget_exceeded {
                    result.status = ForkStatus::BudgetExceeded as i32;
                    result.error = format!(
                        "agent spent {} micro-USD, more than the run's budget allowed ({} charged)",
                        progress.cost_micros, r.committed_micros
                    );
                }
            }
            Err(e) => {
                result.status = ForkStatus::Failed as i32;
                result.error = failure_message(classify("commit spend", &e));
            }
        }
    } else {
        let release = ReleaseRequest {
            reservation_id,
            idempotency_key: key("release"),
        };
        match ctx
            .execute_local_activity(Ledger::release, release, options::ledger_detached())
            .await
        {
            // What the agent charged before it stopped (e.g. budget exceeded) stays spent.
            Ok(r) => result.cost_micros = r.charged_micros,
            Err(e) if result.error.is_empty() => {
                result.error = failure_message(classify("release reservation", &e));
            }
            Err(_) => {}
        }
    }
}
