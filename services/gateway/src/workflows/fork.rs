//! `ForkWorkflow`: one fork of a run, from a ready sandbox to a destroyed one.
//!
//! The run workflow has already reserved the fork's budget and made and checked its
//! sandbox (see `prepare`: those steps are fast local activities, so a sandbox is ready
//! without a child workflow's start on the way). The child then runs the agent → verify
//! (optional) → collects the patch → commits the actual spend → destroys the sandbox.
//! Whatever happens (failure, cancel, budget) ends with the sandbox destroyed and the
//! reservation settled.

use super::{
    failure::{StepFailure, classify, details},
    options, phase, unix_ms,
};
use crate::sandboxes::{AtOwner, SandboxLocal};
use forkyard_proto::{
    activities::{Agent, AgentFailureDetails, LocalSandbox},
    agent::v1::RunAgentRequest,
    common::v1::{DiffStat, ForkResult, ForkStatus, VerifyStatus},
    gateway::v1::RunSpec,
    sandbox::v1::{ExecRequest, Sandbox},
};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use temporalio_macros::{workflow, workflow_methods};
use temporalio_workflow::{WorkflowContext, WorkflowContextView, WorkflowResult};

const OUTPUT_TAIL_BYTES: usize = 4096;

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct ForkInput {
    pub run_id: String,
    pub fork: u32,
    /// 1 for the first start; a fork that waited for budget starts again as attempt 2, …
    /// (idempotency keys include it, so the new attempt is not a replay of the old).
    pub attempt: u32,
    pub spec: RunSpec,
    /// What this fork may spend, reserved in the run's ledger account before it starts.
    pub reservation_micros: i64,
    /// The reservation the run made for this fork; the agent charges it, the child
    /// settles it.
    pub reservation_id: String,
    /// The fork's sandbox, made and health-checked by the run.
    pub sandbox: Option<Sandbox>,
    pub started_unix_ms: i64,
    pub sandbox_ready_unix_ms: i64,
}

#[workflow]
#[derive(Default)]
pub struct ForkWorkflow {
    result: ForkResult,
}

/// What the work steps produced before they stopped.
#[derive(Default)]
pub(super) struct Progress {
    pub(super) cost_micros: i64,
    /// The agent charges its model turns to this reservation as it goes.
    pub(super) reservation_id: String,
}

fn tail(s: &str) -> String {
    forkyard_common::text::tail(s, OUTPUT_TAIL_BYTES).to_owned()
}

fn set_phase(ctx: &WorkflowContext<ForkWorkflow>, p: &str) {
    ctx.state_mut(|s| s.result.phase = p.to_owned());
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
        let wf_id = ctx.workflow_id().to_owned();
        let key = |step: &str| format!("{wf_id}/a{}/{step}", input.attempt.max(1));
        let sandbox = input.sandbox.clone().unwrap_or_default();
        let mut result = ForkResult {
            fork: input.fork,
            status: ForkStatus::Running as i32,
            branch: format!("{}-fork-{}", input.spec.branch, input.fork),
            started_unix_ms: input.started_unix_ms,
            sandbox_ready_unix_ms: input.sandbox_ready_unix_ms,
            sandbox_id: sandbox.id.clone(),
            base_commit: sandbox.base_commit.clone(),
            phase: phase::AGENT.into(),
            verify: VerifyStatus::NotRun as i32,
            ..Default::default()
        };
        sync(ctx, &result);

        let mut progress = Progress {
            reservation_id: input.reservation_id.clone(),
            ..Progress::default()
        };
        let outcome = if sandbox.id.is_empty() {
            Err(StepFailure::Failed(
                "the run gave this fork no sandbox".into(),
            ))
        } else {
            work(ctx, &input, &sandbox, &key, &mut result, &mut progress).await
        };
        if let Err(f) = outcome {
            apply_failure(&mut result, f);
        }
        result.phase = phase::CLEANUP.into();
        sync(ctx, &result);
        super::prepare::settle(ctx, &key, &progress, &mut result).await;

        if !sandbox.id.is_empty()
            && let Err(e) = super::prepare::destroy(ctx, &sandbox, "fork finished").await
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

pub(super) fn failure_message(f: StepFailure) -> String {
    match f {
        StepFailure::Cancelled => "cancelled".to_owned(),
        StepFailure::BudgetExceeded(m) | StepFailure::Failed(m) => m,
    }
}

pub(super) fn apply_failure(result: &mut ForkResult, f: StepFailure) {
    let status = match &f {
        StepFailure::Cancelled => ForkStatus::Cancelled,
        StepFailure::BudgetExceeded(_) => ForkStatus::BudgetExceeded,
        StepFailure::Failed(_) => ForkStatus::Failed,
    };
    result.status = status as i32;
    result.error = failure_message(f);
}

fn cancelled(ctx: &WorkflowContext<ForkWorkflow>) -> Result<(), StepFailure> {
    if ctx.cancellation_token().is_cancelled() {
        Err(StepFailure::Cancelled)
    } else {
        Ok(())
    }
}

async fn work(
    ctx: &mut WorkflowContext<ForkWorkflow>,
    input: &ForkInput,
    sandbox: &Sandbox,
    key: &impl Fn(&str) -> String,
    result: &mut ForkResult,
    progress: &mut Progress,
) -> Result<(), StepFailure> {
    let spec = &input.spec;
    cancelled(ctx)?;
    let run = RunAgentRequest {
        run_id: input.run_id.clone(),
        fork: input.fork,
        sandbox_id: sandbox.id.clone(),
        sandbox_endpoint: sandbox.owner_endpoint.clone(),
        agent: spec.agent.clone(),
        prompt: spec.prompt.clone(),
        timeout_secs: spec.fork_timeout_secs,
        reservation_id: progress.reservation_id.clone(),
        charge_key: key("agent"),
        attempt: input.attempt.max(1),
    };
    let agent_out = match ctx
        .execute_activity(Agent::run, run, options::agent(spec.fork_timeout_secs))
        .await
    {
        Ok(out) => out,
        Err(e) => {
            // The runner replica that ran the failed attempt still holds its transcript.
            if let Some(d) = details::<AgentFailureDetails>(&e) {
                result.transcript_endpoint = d.transcript_endpoint;
            }
            return Err(classify("run agent", &e));
        }
    };
    progress.cost_micros = agent_out.cost_micros;
    result.agent_exit_code = agent_out.exit_code;
    result.agent_output_tail = agent_out.output_tail.clone();
    result.usage = agent_out.usage;
    result.agent_duration_ms = agent_out.duration_ms;
    result
        .transcript_endpoint
        .clone_from(&agent_out.transcript_endpoint);
    result.cost_micros = agent_out.cost_micros;
    let agent_ok = !agent_out.timed_out && agent_out.exit_code == 0;

    if agent_ok && !spec.verify_command.trim().is_empty() {
        result.phase = phase::VERIFYING.into();
        sync(ctx, result);
        let exec = ExecRequest {
            sandbox_id: sandbox.id.clone(),
            argv: vec!["sh".into(), "-c".into(), spec.verify_command.clone()],
            env: HashMap::new(),
            timeout_secs: spec.verify_timeout_secs,
        };
        let out = ctx
            .execute_activity(
                LocalSandbox::exec,
                exec,
                options::verify(
                    options::sandbox_queue(&sandbox.owner_task_queue),
                    spec.verify_timeout_secs,
                ),
            )
            .await
            .map_err(|e| classify("verify", &e))?;
        result.verify = if out.timed_out {
            VerifyStatus::TimedOut
        } else if out.exit_code == 0 {
            VerifyStatus::Passed
        } else {
            VerifyStatus::Failed
        } as i32;
        result.verify_exit_code = out.exit_code;
        let mut text = tail(&out.stdout);
        if !out.stderr.is_empty() {
            text.push_str("\n--- stderr ---\n");
            text.push_str(&tail(&out.stderr));
        }
        result.verify_output_tail = text;
        result.verify_duration_ms = out.duration_ms;
    }

    // The patch is collected even from a failed agent: it shows what it did.
    set_phase(ctx, phase::PATCH);
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
    result.patch = patch.patch;
    result.patch_truncated = patch.truncated;
    result.patch_bytes = patch.patch_bytes;
    result.diffstat = Some(patch.diffstat.unwrap_or(DiffStat::default()));

    if agent_out.timed_out {
        result.status = ForkStatus::TimedOut as i32;
        result.error = format!("agent did not finish within {} s", spec.fork_timeout_secs);
    } else if agent_out.exit_code != 0 {
        result.status = ForkStatus::Failed as i32;
        result.error = format!("agent exited with code {}", agent_out.exit_code);
    } else {
        result.status = ForkStatus::Succeeded as i32;
    }
    Ok(())
}
