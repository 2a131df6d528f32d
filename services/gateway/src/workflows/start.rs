//! Starting a prepared fork: its steps inline in the run, or its child workflow; and
//! what the run gives back of a fork that never started.

use super::{
    failure::StepFailure,
    fork::ForkWorkflow,
    fork_result::apply_failure,
    inline::{self, AgentDone},
    input::{ForkInput, step_key},
    phase,
    prepare::{Prepared, WaveFork},
    run_state::SandboxOrchestrationWorkflow,
    settle,
};
use forkyard_common::clock::unix_ms;
use forkyard_proto::common::v1::ForkResult;
use futures::future::LocalBoxFuture;
use temporalio_workflow::{
    ChildWorkflowCancellationType, ChildWorkflowOptions, ParentClosePolicy, WorkflowContext,
};

type Ctx = WorkflowContext<SandboxOrchestrationWorkflow>;

/// How a prepared fork's child ended, or an inline fork's agent.
pub(super) enum ChildOutcome {
    Finished(Box<ForkResult>),
    /// An inline fork's agent (and verify) ended: it finishes with its batch.
    AgentDone(Box<AgentDone>),
    /// The child never started (the fork was cancelled first): what it was prepared
    /// with is still the run's to give back.
    NotStarted(Box<(WaveFork, Prepared, StepFailure)>),
}

pub(super) type InFlight<'a> = LocalBoxFuture<'a, (u32, ChildOutcome)>;

pub(super) fn child_id(run_id: &str, fork: u32) -> String {
    forkyard_proto::ids::ForkId::new(run_id, fork).to_string()
}

/// A fork whose child never started: nobody else owns its sandbox and reservation yet,
/// so they are given back here, one fork at a time (see `prepare_wave` on why not
/// concurrently).
pub(super) async fn give_back(
    ctx: &Ctx,
    (f, prepared, why): (WaveFork, Prepared, StepFailure),
) -> ForkResult {
    let _ = settle::destroy(ctx, &prepared.sandbox, "fork child did not start", false).await;
    let key = step_key(&f.child_id, f.input.attempt, "release");
    settle::release(ctx, &key, &prepared.reservation_id).await;
    not_started(ctx, &f.input, why)
}

/// The result of a fork that stopped before its child ran.
pub(super) fn not_started(ctx: &Ctx, input: &ForkInput, why: StepFailure) -> ForkResult {
    let budget = matches!(why, StepFailure::BudgetExceeded(_));
    let mut r = ForkResult {
        fork: input.fork,
        started_unix_ms: input.started_unix_ms,
        finished_unix_ms: unix_ms(ctx.workflow_time()),
        // A refused reservation: the run re-queues the fork until a raise (`record`).
        phase: if budget {
            phase::AWAITING_BUDGET
        } else {
            phase::DONE
        }
        .into(),
        ..Default::default()
    };
    apply_failure(&mut r, why);
    r
}

/// Run a prepared fork: inline (`RunSpec::inline_forks`), or in a child of its own.
pub(super) fn start_fork(ctx: &Ctx, f: WaveFork, prepared: Prepared) -> InFlight<'_> {
    if !f.input.spec.inline_forks {
        let input = inline::input_for(&f, &prepared);
        return run_child(ctx, f, prepared, input);
    }
    let fork = f.input.fork;
    Box::pin(async move {
        let show = |r: &ForkResult| ctx.state_mut(|s| s.show(fork, r));
        let done = inline::agent(ctx, f, prepared, show).await;
        (fork, ChildOutcome::AgentDone(Box::new(done)))
    })
}

/// Start a prepared fork's child (or an inline fork's, for its handoff) and wait for
/// its result.
pub(super) fn run_child(
    ctx: &Ctx,
    f: WaveFork,
    prepared: Prepared,
    input: ForkInput,
) -> InFlight<'_> {
    let fork = f.input.fork;
    if input.handoff.is_none() {
        ctx.state_mut(|s| s.set_fork_phase(fork, phase::AGENT));
    }
    let opts = ChildWorkflowOptions::builder()
        .workflow_id(f.child_id.clone())
        .parent_close_policy(ParentClosePolicy::RequestCancel)
        .cancel_type(ChildWorkflowCancellationType::WaitCancellationCompleted)
        .cancellation_token(f.cancel.clone())
        .build();
    Box::pin(async move {
        let started = match ctx
            .start_child_workflow(ForkWorkflow::run, input, opts)
            .await
        {
            Ok(started) => started,
            Err(e) => {
                let why = if f.cancel.is_cancelled() {
                    StepFailure::Cancelled
                } else {
                    StepFailure::Failed(format!("start fork workflow: {e}"))
                };
                return (fork, ChildOutcome::NotStarted(Box::new((f, prepared, why))));
            }
        };
        let result = started.result().await.unwrap_or_else(|e| {
            // A child that failed or was terminated has settled nothing: the janitor
            // reaps its sandbox and releases its reservation once it has closed.
            let why = if f.cancel.is_cancelled() {
                StepFailure::Cancelled
            } else {
                StepFailure::Failed(e.to_string())
            };
            ForkResult {
                sandbox_id: prepared.sandbox.id.clone(),
                ..not_started(ctx, &f.input, why)
            }
        });
        (fork, ChildOutcome::Finished(Box::new(result)))
    })
}
