//! A fork's first and last steps, shared by the run and the fork workflows.
//!
//! The run workflow prepares its forks itself before it starts their children:
//! reserve budget → create sandbox → health check, all local activities (see
//! `crate::sandboxes` and `crate::ledger` for why), a wave of forks at a time in
//! lockstep (see [`prepare_wave`]); the wave's reserves are one local activity. So the way from `LaunchRun` to a ready sandbox holds
//! no child-workflow start and no matched activity task, and the child's history starts
//! at the agent. What prepare made is never lost: reserve and create run on a detached
//! cancellation token, and a fork cancelled (or failed) before its child started has its
//! sandbox destroyed and its reservation released here.
//!
//! Settlement and destroy are the child's last steps (and the run's, for a fork that
//! never reached its child).

use super::{
    failure::{StepFailure, classify, refused},
    fork::{ForkInput, Progress, failure_message},
    options,
    orchestration::SandboxOrchestrationWorkflow,
    phase,
};
use crate::{
    ledger::{LedgerLocal, Reserves},
    sandboxes::{AtOwner, SandboxLocal},
};
use forkyard_proto::{
    activities::Ledger,
    budget::v1::{CommitRequest, ReleaseRequest, ReserveRequest},
    common::v1::{ForkResult, ForkStatus},
    labels,
    sandbox::v1::{CreateSandboxRequest, DestroySandboxResponse, Sandbox},
};
use std::{collections::HashMap, future::Future, pin::Pin, task::Poll};
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

/// One fork of a wave: what it needs, its child's id and its own cancellation token
/// (cancelled by CancelFork, an early stop or the run's cancellation).
pub(super) struct WaveFork {
    pub input: ForkInput,
    pub child_id: String,
    pub cancel: WorkflowCancellationToken,
}

/// Where one fork of a wave is while it is prepared.
enum Step {
    Reserved {
        reservation_id: String,
    },
    Created {
        reservation_id: String,
        sandbox: Sandbox,
    },
    Ready(Prepared),
    /// Stopped; what it holds is given back in the wave's cleanup stages.
    Failed {
        reservation_id: Option<String>,
        sandbox: Option<Sandbox>,
        why: StepFailure,
    },
}

/// Reserve, create and check the sandboxes of a wave of forks (the forks the run starts
/// at one time), in lockstep: every fork's reserve, then every create, then every health
/// check, then the cleanup of the forks that stopped (destroy, then release).
///
/// Why lockstep: the Rust SDK replays a workflow's local activities in the order their
/// markers were recorded, but it may hand several results to the workflow in one
/// activation where the first run had them in several (or the other way round). If each
/// fork went on to its next step as soon as its own result came, the order of the next
/// local activities (their sequence numbers) and of the child starts would follow that
/// batching, and a replay (after a gateway crash or a cache eviction) could fail as
/// nondeterministic, or worse hand one fork's result to another. Waiting for the whole
/// stage makes every step start in fork order, whatever the timing.
pub(super) async fn prepare_wave(
    ctx: &WorkflowContext<SandboxOrchestrationWorkflow>,
    wave: &[WaveFork],
) -> Vec<Result<Prepared, StepFailure>> {
    let key = |f: &WaveFork, step: &str| step_key(&f.child_id, f.input.attempt, step);
    let phase_is = |f: &WaveFork, p: &str| ctx.state_mut(|s| s.set_fork_phase(f.input.fork, p));

    // The whole wave's reserves in one local activity: one marker, not one per fork.
    let requests: Vec<ReserveRequest> = wave
        .iter()
        .map(|f| ReserveRequest {
            account_id: f.input.run_id.clone(),
            amount_micros: f.input.reservation_micros,
            holder: f.child_id.clone(),
            idempotency_key: key(f, "reserve"),
        })
        .collect();
    let reserved = ctx
        .execute_local_activity(
            LedgerLocal::reserve_many,
            Reserves { requests },
            options::ledger_detached(),
        )
        .await;
    let failed = |why: StepFailure| Step::Failed {
        reservation_id: None,
        sandbox: None,
        why,
    };
    let mut steps: Vec<Step> = match reserved {
        Ok(r) if r.outcomes.len() == wave.len() => r
            .outcomes
            .into_iter()
            .map(|o| match o.error_type.as_str() {
                "" => Step::Reserved {
                    reservation_id: o.reservation_id,
                },
                ty => failed(refused("reserve budget", Some(ty), &o.error)),
            })
            .collect(),
        Ok(r) => wave
            .iter()
            .map(|_| {
                failed(StepFailure::Failed(format!(
                    "reserve budget: the ledger answered {} of {} reserves",
                    r.outcomes.len(),
                    wave.len()
                )))
            })
            .collect(),
        Err(e) => wave
            .iter()
            .map(|_| failed(classify("reserve budget", &e)))
            .collect(),
    };

    // Create the sandboxes of the forks still going.
    let creates = wave.iter().zip(&steps).map(|(f, step)| {
        let go = matches!(step, Step::Reserved { .. }) && !f.cancel.is_cancelled();
        if go {
            phase_is(f, phase::CREATING);
        }
        let spec = &f.input.spec;
        let create = CreateSandboxRequest {
            backend: "local".into(),
            repo: spec.repo.clone(),
            base_ref: spec.base_ref.clone(),
            branch: format!("{}-fork-{}", spec.branch, f.input.fork),
            labels: HashMap::from([
                (labels::RUN_ID.to_owned(), f.input.run_id.clone()),
                (labels::FORK.to_owned(), f.input.fork.to_string()),
                // The child that will own it; until the child starts, the janitor
                // keeps a sandbox whose run is running.
                (labels::WORKFLOW_ID.to_owned(), f.child_id.clone()),
            ]),
            idempotency_key: key(f, "create"),
            network: false,
            ..Default::default()
        };
        async move {
            if go {
                Some(
                    ctx.execute_local_activity(
                        SandboxLocal::create,
                        create,
                        options::create_local(),
                    )
                    .await,
                )
            } else {
                None
            }
        }
    });
    let created = join_all(creates).await;
    for ((f, step), out) in wave.iter().zip(steps.iter_mut()).zip(created) {
        let Step::Reserved { reservation_id } = step else {
            continue;
        };
        let reservation_id = std::mem::take(reservation_id);
        *step = match out {
            Some(Ok(sandbox)) => Step::Created {
                reservation_id,
                sandbox,
            },
            Some(Err(e)) => Step::Failed {
                reservation_id: Some(reservation_id),
                sandbox: None,
                why: classify("create sandbox", &e),
            },
            None => Step::Failed {
                reservation_id: Some(reservation_id),
                sandbox: None,
                why: cancelled_or_failed(f),
            },
        };
    }

    // Health-check what was made.
    let checks = wave.iter().zip(&steps).map(|(f, step)| {
        let target = match step {
            Step::Created { sandbox, .. } if !f.cancel.is_cancelled() => {
                phase_is(f, phase::CHECKING);
                Some(at(sandbox, ""))
            }
            _ => None,
        };
        async move {
            match target {
                Some(t) => Some(
                    ctx.execute_local_activity(
                        SandboxLocal::health,
                        t,
                        options::health_local(f.cancel.clone()),
                    )
                    .await,
                ),
                None => None,
            }
        }
    });
    let checked = join_all(checks).await;
    for ((f, step), out) in wave.iter().zip(steps.iter_mut()).zip(checked) {
        let Step::Created {
            reservation_id,
            sandbox,
        } = step
        else {
            continue;
        };
        let (reservation_id, sandbox) = (std::mem::take(reservation_id), std::mem::take(sandbox));
        let ready = match out {
            Some(Ok(h)) if h.healthy && !f.cancel.is_cancelled() => Ok(h.checked_unix_ms),
            Some(Ok(h)) if !h.healthy => {
                Err(StepFailure::Failed(format!("health check: {}", h.detail)))
            }
            Some(Err(e)) => Err(classify("health check", &e)),
            _ => Err(cancelled_or_failed(f)),
        };
        *step = match ready {
            Ok(ready_unix_ms) => Step::Ready(Prepared {
                reservation_id,
                sandbox,
                ready_unix_ms,
            }),
            Err(why) => Step::Failed {
                reservation_id: Some(reservation_id),
                sandbox: Some(sandbox),
                why,
            },
        };
    }

    // Give back what the stopped forks hold: sandboxes first, then reservations.
    let destroys = steps.iter().map(|step| async move {
        if let Step::Failed {
            sandbox: Some(sb), ..
        } = step
        {
            let _ = destroy(ctx, sb, "fork did not start").await;
        }
    });
    join_all(destroys).await;
    let releases = wave.iter().zip(&steps).map(|(f, step)| async move {
        if let Step::Failed {
            reservation_id: Some(id),
            ..
        } = step
        {
            release(ctx, &key(f, "release"), id).await;
        }
    });
    join_all(releases).await;

    steps
        .into_iter()
        .map(|step| match step {
            Step::Ready(p) => Ok(p),
            Step::Failed { why, .. } => Err(why),
            // Every fork left the loop above ready or failed.
            Step::Reserved { .. } | Step::Created { .. } => Err(StepFailure::Failed(
                "fork preparation did not finish".into(),
            )),
        })
        .collect()
}

/// Every future's output, in order. Unlike `futures::future::join_all` (which puts more
/// than 30 futures in a `FuturesOrdered` with wakers of its own), it polls each future
/// with the workflow task's waker, the only kind the SDK accepts.
async fn join_all<F: Future>(futs: impl IntoIterator<Item = F>) -> Vec<F::Output> {
    let mut futs: Vec<Pin<Box<F>>> = futs.into_iter().map(Box::pin).collect();
    let mut outs: Vec<Option<F::Output>> = futs.iter().map(|_| None).collect();
    std::future::poll_fn(move |cx| {
        let mut pending = false;
        for (fut, out) in futs.iter_mut().zip(outs.iter_mut()) {
            if out.is_none() {
                match fut.as_mut().poll(cx) {
                    Poll::Ready(v) => *out = Some(v),
                    Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            Poll::Pending
        } else {
            Poll::Ready(outs.iter_mut().filter_map(Option::take).collect())
        }
    })
    .await
}

fn cancelled_or_failed(f: &WaveFork) -> StepFailure {
    if f.cancel.is_cancelled() {
        StepFailure::Cancelled
    } else {
        StepFailure::Failed("fork preparation stopped".into())
    }
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
