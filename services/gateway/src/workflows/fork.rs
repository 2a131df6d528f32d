//! A fork's steps after its sandbox is ready, and `ForkWorkflow`, the child workflow that
//! runs them for a fork of a large run.
//!
//! The run workflow has already reserved the fork's budget and made and checked its
//! sandbox (see `prepare`). Then: agent → verify (optional) → patch → commit the actual
//! spend → destroy the sandbox. A run of up to `--inline-fork-limit` forks runs these
//! steps itself (`inline`); a larger run, and an inline fork whose patch is too large
//! for the run's history, has a `ForkWorkflow` child run them (from the patch on, for the
//! latter: its `handoff`). Whatever happens (failure, cancel, budget) ends with the
//! sandbox destroyed and the reservation settled.

use super::{
    failure::{StepFailure, classify, details},
    options, phase, unix_ms,
};
use crate::sandboxes::{AtOwner, SandboxLocal};
use forkyard_proto::{
    activities::{Agent, AgentFailureDetails, LocalSandbox},
    agent::v1::RunAgentRequest,
    common::v1::{ForkResult, ForkStatus, VerifyStatus},
    gateway::v1::RunSpec,
    sandbox::v1::{CollectPatchResponse, ExecRequest, Sandbox},
};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use temporalio_macros::{workflow, workflow_methods};
use temporalio_workflow::{
    WorkflowCancellationToken, WorkflowContext, WorkflowContextView, WorkflowResult,
};

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
    /// Set when the run ran the agent (and verify) itself and the patch was too large
    /// for its history: the child goes on from the patch.
    pub handoff: Option<Handoff>,
}

/// What a run hands to the child of an inline fork whose patch it cannot keep.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Handoff {
    /// The fork so far (agent and verify results, no patch).
    pub result: ForkResult,
    pub agent: AgentEnd,
    pub cost_micros: i64,
    pub sandbox_charged_micros: i64,
}

/// How the agent ended, for the fork's status once its patch is in.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct AgentEnd {
    pub timed_out: bool,
    pub exit_code: i32,
    /// Stopped because the workspace grew past the sandbox's disk limit.
    pub over_disk_limit: bool,
}

#[workflow]
#[derive(Default)]
pub struct ForkWorkflow {
    result: ForkResult,
}

/// What the work steps produced before they stopped.
#[derive(Default)]
pub(super) struct Progress {
    /// What the agent spent: its model usage and the sandbox time it charged.
    pub(super) cost_micros: i64,
    /// Of `cost_micros`, the sandbox's part charged while the agent ran.
    pub(super) sandbox_charged_micros: i64,
    /// The sandbox's whole cost, read when the patch was collected (its last command).
    pub(super) sandbox_cost_micros: Option<i64>,
    /// The agent charges its model turns to this reservation as it goes.
    pub(super) reservation_id: String,
}

/// Where a fork's steps run: the fork's own child workflow, or its run (whose history
/// holds every inline fork's activities, told apart by their ids).
pub(super) struct Host<'a> {
    /// Cancelled by CancelFork, an early stop or the run's cancellation.
    pub cancel: WorkflowCancellationToken,
    /// Activity ids `fork-<n>/a<attempt>/<step>` (inline forks); `None`: the SDK's.
    pub activity_ids: Option<String>,
    /// Shows the fork's progress (its phase) to queries.
    pub show: &'a dyn Fn(&ForkResult),
}

impl Host<'_> {
    fn activity_id(&self, step: &str) -> Option<String> {
        self.activity_ids.as_ref().map(|p| format!("{p}/{step}"))
    }
}

fn tail(s: &str) -> String {
    forkyard_common::text::tail(s, OUTPUT_TAIL_BYTES).to_owned()
}

fn sync(ctx: &WorkflowContext<ForkWorkflow>, result: &ForkResult) {
    let r = result.clone();
    ctx.state_mut(|s| s.result = r);
}

/// The fork's result as it starts its steps.
pub(super) fn starting(input: &ForkInput, sandbox: &Sandbox) -> ForkResult {
    ForkResult {
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
    }
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
        let patches = super::patches::Patches::decide(ctx);
        let wf_id = ctx.workflow_id().to_owned();
        let key = |step: &str| format!("{wf_id}/a{}/{step}", input.attempt.max(1));
        let sandbox = input.sandbox.clone().unwrap_or_default();
        let show = |r: &ForkResult| sync(ctx, r);
        let host = Host {
            cancel: ctx.cancellation_token(),
            activity_ids: None,
            show: &show,
        };
        let mut progress = Progress {
            reservation_id: input.reservation_id.clone(),
            ..Progress::default()
        };
        let (mut result, agent) = match input.handoff.clone() {
            Some(h) => {
                progress.cost_micros = h.cost_micros;
                progress.sandbox_charged_micros = h.sandbox_charged_micros;
                (h.result, Ok(h.agent))
            }
            None => {
                let mut result = starting(&input, &sandbox);
                sync(ctx, &result);
                let agent = if sandbox.id.is_empty() {
                    Err(StepFailure::Failed(
                        "the run gave this fork no sandbox".into(),
                    ))
                } else {
                    agent_and_verify(
                        ctx,
                        &host,
                        &input,
                        &sandbox,
                        &key,
                        &mut result,
                        &mut progress,
                    )
                    .await
                };
                (result, agent)
            }
        };
        let outcome = match agent {
            Ok(end) => patch(ctx, &host, &sandbox, &mut result, &mut progress)
                .await
                .map(|()| apply_agent_end(&mut result, end, input.spec.fork_timeout_secs)),
            Err(f) => Err(f),
        };
        if let Err(f) = outcome {
            apply_failure(&mut result, f);
        }
        result.phase = phase::CLEANUP.into();
        sync(ctx, &result);
        super::prepare::settle(ctx, &key, &progress, patches, &mut result).await;

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
        StepFailure::BudgetExceeded(m) | StepFailure::SandboxLost(m) | StepFailure::Failed(m) => m,
    }
}

pub(super) fn apply_failure(result: &mut ForkResult, f: StepFailure) {
    let status = match &f {
        StepFailure::Cancelled => ForkStatus::Cancelled,
        StepFailure::BudgetExceeded(_) => ForkStatus::BudgetExceeded,
        StepFailure::SandboxLost(_) | StepFailure::Failed(_) => ForkStatus::Failed,
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

fn cancelled(host: &Host<'_>) -> Result<(), StepFailure> {
    if host.cancel.is_cancelled() {
        Err(StepFailure::Cancelled)
    } else {
        Ok(())
    }
}

/// The agent, then the verify command if the run has one and the agent succeeded.
pub(super) async fn agent_and_verify<W>(
    ctx: &WorkflowContext<W>,
    host: &Host<'_>,
    input: &ForkInput,
    sandbox: &Sandbox,
    key: &impl Fn(&str) -> String,
    result: &mut ForkResult,
    progress: &mut Progress,
) -> Result<AgentEnd, StepFailure> {
    let spec = &input.spec;
    cancelled(host)?;
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
        output_tail_bytes: super::history::history_caps(spec).agent_tail,
    };
    let mut opts = options::agent(spec.fork_timeout_secs);
    opts.cancellation_token = Some(host.cancel.clone());
    opts.activity_id = host.activity_id("agent");
    let agent_out = match ctx.execute_activity(Agent::run, run, opts).await {
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
    progress.sandbox_charged_micros = agent_out.sandbox_charged_micros;
    result.agent_exit_code = agent_out.exit_code;
    result.agent_output_tail = agent_out.output_tail.clone();
    result.usage = agent_out.usage;
    result.agent_duration_ms = agent_out.duration_ms;
    result
        .transcript_endpoint
        .clone_from(&agent_out.transcript_endpoint);
    result.cost_micros = agent_out.cost_micros;
    let end = AgentEnd {
        timed_out: agent_out.timed_out,
        exit_code: agent_out.exit_code,
        over_disk_limit: agent_out.workspace_over_limit,
    };
    let agent_ok = !end.timed_out && end.exit_code == 0 && !end.over_disk_limit;

    if agent_ok && !spec.verify_command.trim().is_empty() {
        result.phase = phase::VERIFYING.into();
        (host.show)(result);
        let exec = ExecRequest {
            sandbox_id: sandbox.id.clone(),
            argv: vec!["sh".into(), "-c".into(), spec.verify_command.clone()],
            env: HashMap::new(),
            timeout_secs: spec.verify_timeout_secs,
            // Only the tails are kept (in the history, too).
            output_tail_bytes: super::history::history_caps(spec).verify_tail,
            ..Default::default()
        };
        let mut opts = options::verify(
            options::sandbox_queue(&sandbox.owner_task_queue),
            spec.verify_timeout_secs,
        );
        opts.cancellation_token = Some(host.cancel.clone());
        opts.activity_id = host.activity_id("verify");
        let out = ctx
            .execute_activity(LocalSandbox::exec, exec, opts)
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
    Ok(end)
}

/// The child's patch step: the whole patch (up to the provisioner's cap), even from a
/// failed agent (it shows what it did).
async fn patch(
    ctx: &WorkflowContext<ForkWorkflow>,
    host: &Host<'_>,
    sandbox: &Sandbox,
    result: &mut ForkResult,
    progress: &mut Progress,
) -> Result<(), StepFailure> {
    result.phase = phase::PATCH.into();
    (host.show)(result);
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
    progress.sandbox_cost_micros = patch.usage.map(|u| u.cost_micros);
    apply_patch(result, patch);
    Ok(())
}
