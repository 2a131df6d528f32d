//! `ForkWorkflow`, the child workflow that runs a fork's steps for a fork of a large run.
//!
//! The run workflow has already reserved the fork's budget and made and checked its
//! sandbox (see `prepare`). Then: agent → verify (optional) → patch → commit the actual
//! spend → destroy the sandbox. A run of up to `--inline-fork-limit` forks runs these
//! steps itself (`inline`); a larger run, and an inline fork whose patch is too large
//! for the run's history, has a `ForkWorkflow` child run them (from the patch on, for the
//! latter: its `handoff`). Whatever happens (failure, cancel, budget) ends with the
//! sandbox destroyed and the reservation settled.

use super::{
    failure::{StepFailure, classify, failure_message},
    fork_result::{apply_agent_end, apply_failure, apply_patch, starting},
    input::{ForkInput, Progress, step_key},
    options,
    patches::Patches,
    phase, settle,
    steps::{AgentRan, ForkSteps, agent_and_verify},
    unix_ms,
};
use crate::sandboxes::{AtOwner, SandboxLocal};
use forkyard_proto::{common::v1::ForkResult, sandbox::v1::Sandbox};
use temporalio_macros::{workflow, workflow_methods};
use temporalio_workflow::{WorkflowContext, WorkflowContextView, WorkflowResult};

#[workflow]
#[derive(Default)]
pub struct ForkWorkflow {
    result: ForkResult,
}

fn sync(ctx: &WorkflowContext<ForkWorkflow>, result: &ForkResult) {
    let r = result.clone();
    ctx.state_mut(|s| s.result = r);
}

#[workflow_methods]
impl ForkWorkflow {
    #[run(name = "ForkWorkflow")]
    pub async fn run(
        ctx: &mut WorkflowContext<Self>,
        input: ForkInput,
    ) -> WorkflowResult<ForkResult> {
        let ctx = &*ctx;
        // First, before any await (see `patches`).
        let patches = Patches::decide(ctx);
        let wf_id = ctx.workflow_id().to_owned();
        let sandbox = input.sandbox.clone().unwrap_or_default();
        let steps = ForkSteps {
            input: &input,
            sandbox: &sandbox,
            key_owner: &wf_id,
            cancel: ctx.cancellation_token(),
            activity_ids: None,
        };
        let AgentRan {
            mut result,
            mut progress,
            agent,
        } = agent_ran(ctx, &steps).await;
        let outcome = match agent {
            Ok(end) => {
                result.phase = phase::PATCH.into();
                sync(ctx, &result);
                patch(ctx, &sandbox).await.map(|(patch, sandbox_cost)| {
                    progress.sandbox_cost_micros = sandbox_cost;
                    apply_patch(&mut result, patch);
                    apply_agent_end(&mut result, end, input.spec.fork_timeout_secs);
                })
            }
            Err(f) => Err(f),
        };
        if let Err(f) = outcome {
            apply_failure(&mut result, f);
        }
        result.phase = phase::CLEANUP.into();
        sync(ctx, &result);
        let key = |step: &str| step_key(&wf_id, input.attempt, step);
        settle::settle(ctx, &key, &progress, patches, &mut result).await;

        let lost = result.error.contains(super::SANDBOX_LOST);
        if !sandbox.id.is_empty()
            && let Err(e) = settle::destroy(ctx, &sandbox, "fork finished", lost).await
        {
            // Its owning workflow closes next: the janitor's sweep reaps it.
            let msg = failure_message(classify("destroy sandbox", &e));
            if result.error.is_empty() {
                result.error = msg;
            }
        }
        result.phase = phase::DONE.into();
        result.finished_unix_ms = unix_ms(ctx.workflow_time());
        sync(ctx, &result);
        Ok(result)
    }

    /// The fork as it is now (while running: its phase and what it has so far).
    #[query]
    pub fn progress(&self, _ctx: &WorkflowContextView) -> ForkResult {
        self.result.clone()
    }
}

/// The fork's agent and verify: run now, or (a handoff from the run workflow) what they
/// ended with there. A fork without a sandbox fails here.
async fn agent_ran(ctx: &WorkflowContext<ForkWorkflow>, steps: &ForkSteps<'_>) -> AgentRan {
    let (input, sandbox) = (steps.input, steps.sandbox);
    if let Some(h) = input.handoff.clone() {
        return AgentRan {
            result: h.result,
            progress: Progress {
                reservation_id: input.reservation_id.clone(),
                cost_micros: h.cost_micros,
                sandbox_charged_micros: h.sandbox_charged_micros,
                sandbox_cost_micros: None,
            },
            agent: Ok(h.agent),
        };
    }
    let result = starting(input, sandbox);
    sync(ctx, &result);
    if sandbox.id.is_empty() {
        return AgentRan {
            result,
            progress: Progress {
                reservation_id: input.reservation_id.clone(),
                ..Progress::default()
            },
            agent: Err(StepFailure::Failed(
                "the run gave this fork no sandbox".into(),
            )),
        };
    }
    agent_and_verify(ctx, steps, result, |r| sync(ctx, r)).await
}

/// The child's patch step: the whole patch (up to the provisioner's cap), even from a
/// failed agent (it shows what it did), and the sandbox's whole cost read with it.
async fn patch(
    ctx: &WorkflowContext<ForkWorkflow>,
    sandbox: &Sandbox,
) -> Result<
    (
        forkyard_proto::sandbox::v1::CollectPatchResponse,
        Option<i64>,
    ),
    StepFailure,
> {
    let patch = ctx
        .execute_local_activity(
            SandboxLocal::collect_patch,
            AtOwner {
                endpoint: sandbox.owner_endpoint.clone(),
                sandbox_id: sandbox.id.clone(),
                reason: String::new(),
            },
            options::collect_patch_local(),
        )
        .await
        .map_err(|e| classify("collect patch", &e))?;
    let sandbox_cost = patch.usage.map(|u| u.cost_micros);
    Ok((patch, sandbox_cost))
}
