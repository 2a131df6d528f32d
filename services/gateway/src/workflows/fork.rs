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
    failure::{StepFailure, classify},
    fork_result::{apply_ended, apply_failure, starting},
    input::{ForkInput, Progress},
    options,
    patches::Patches,
    phase, settle,
    steps::{AgentRan, ForkSteps, agent_and_verify, finish_item},
};
use crate::{
    activities::sandboxes::SandboxLocal,
    lifecycle::{
        AtOwner,
        charge::Settlement,
        finish::{FinishSteps, finish_fork},
        item::FinishItem,
    },
};
use forkyard_common::clock::unix_ms;
use forkyard_proto::{
    budget::v1::Reservation, common::v1::ForkResult, sandbox::v1::CollectPatchResponse,
};
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
        let ran = agent_ran(ctx, &steps).await;
        let fork = finish_item(&input, &sandbox, &wf_id, &ran);
        let AgentRan {
            mut result, agent, ..
        } = ran;
        // Shown while the fork is finished: how its agent failed, or that its patch is next.
        result.phase = match &agent {
            Ok(_) => phase::PATCH,
            Err(f) => {
                apply_failure(&mut result, f.clone());
                phase::CLEANUP
            }
        }
        .into();
        sync(ctx, &result);
        let Some(ended) = finish_fork(&ChildSteps { ctx, patches }, &fork).await else {
            unreachable!("a child keeps every patch")
        };
        let now = unix_ms(ctx.workflow_time());
        apply_ended(&mut result, agent, ended, input.spec.fork_timeout_secs, now);
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

/// The child's last steps: each a local activity of its own, in its history, retried
/// by Temporal as the one table says (`options`).
struct ChildSteps<'a> {
    ctx: &'a WorkflowContext<ForkWorkflow>,
    patches: Patches,
}

impl FinishSteps for ChildSteps<'_> {
    type Failure = StepFailure;

    /// The whole patch (up to the provisioner's cap), even from a failed agent (it shows
    /// what it did), and the sandbox's whole cost read with it.
    async fn collect_patch(&self, fork: &FinishItem) -> Result<CollectPatchResponse, StepFailure> {
        let at = AtOwner {
            reason: String::new(),
            ..fork.sandbox.clone()
        };
        let options = options::collect_patch_local();
        self.ctx
            .execute_local_activity(SandboxLocal::collect_patch, at, options)
            .await
            .map_err(|e| classify("collect patch", &e))
    }

    /// The child keeps every patch: it has a history of its own.
    fn hands_off(&self, _patch: &CollectPatchResponse) -> bool {
        false
    }

    fn names_lost(&self, failure: &StepFailure) -> bool {
        failure.names_lost()
    }

    async fn settle(&self, s: &Settlement) -> Result<Reservation, StepFailure> {
        self.ctx
            .state_mut(|w| w.result.phase = phase::CLEANUP.into());
        settle::settle(self.ctx, self.patches, s).await
    }

    async fn persist(&self, sandbox: &AtOwner) -> Result<String, StepFailure> {
        let options = options::collect_patch_local();
        self.ctx
            .execute_local_activity(SandboxLocal::persist, sandbox.clone(), options)
            .await
            .map(|r| r.snapshot_id)
            .map_err(|e| classify("snapshot workspace", &e))
    }

    async fn destroy(&self, sandbox: &AtOwner, lost: bool) -> Result<(), StepFailure> {
        settle::destroy_at(self.ctx, sandbox.clone(), lost)
            .await
            .map(drop)
            .map_err(|e| classify("destroy sandbox", &e))
    }
}
