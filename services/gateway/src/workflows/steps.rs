//! A fork's agent and verify steps: regular activities on the runner's and the sandbox
//! owner's queues, run by whichever workflow runs the fork (its run for an inline fork,
//! its `ForkWorkflow` child otherwise).

use super::{
    failure::{StepFailure, classify, details},
    history::history_caps,
    input::{AgentEnd, ForkInput, Progress, step_key},
    options, phase,
};
use crate::lifecycle::{AtOwner, item::FinishItem};
use forkyard_proto::{
    activities::{Agent, AgentFailureDetails, E2bSandbox, LocalSandbox},
    agent::v1::{BranchOf, RunAgentRequest, RunAgentResponse},
    common::v1::{ForkResult, VerifyStatus},
    sandbox::v1::{ExecRequest, ExecResponse, Sandbox},
};
use std::collections::HashMap;
use temporalio_workflow::{WorkflowCancellationToken, WorkflowContext};

const OUTPUT_TAIL_BYTES: usize = 4096;

/// One fork's steps: what they run on, and where (the fork's own child workflow, or its
/// run, whose history holds every inline fork's activities, told apart by their ids).
pub(super) struct ForkSteps<'a> {
    pub input: &'a ForkInput,
    pub sandbox: &'a Sandbox,
    /// The id of the workflow that owns the fork's steps' keys (its child's id, also
    /// for an inline fork): keys are `<owner>/a<attempt>/<step>`.
    pub key_owner: &'a str,
    /// Cancelled by CancelFork, an early stop or the run's cancellation.
    pub cancel: WorkflowCancellationToken,
    /// Activity ids `fork-<n>/a<attempt>/<step>` (inline forks); `None`: the SDK's.
    pub activity_ids: Option<String>,
}

impl ForkSteps<'_> {
    pub(super) fn key(&self, step: &str) -> String {
        step_key(self.key_owner, self.input.attempt, step)
    }

    fn activity_id(&self, step: &str) -> Option<String> {
        self.activity_ids.as_ref().map(|p| format!("{p}/{step}"))
    }

    fn cancelled(&self) -> Result<(), StepFailure> {
        if self.cancel.is_cancelled() {
            Err(StepFailure::Cancelled)
        } else {
            Ok(())
        }
    }
}

/// What the agent and verify steps did to the fork.
pub(super) struct AgentRan {
    pub result: ForkResult,
    pub progress: Progress,
    pub agent: Result<AgentEnd, StepFailure>,
}

/// The agent, then the verify command if the run has one and the agent succeeded.
/// `show` is told of the fork's progress (its phase) as it changes.
pub(super) async fn agent_and_verify<W>(
    ctx: &WorkflowContext<W>,
    steps: &ForkSteps<'_>,
    mut result: ForkResult,
    show: impl Fn(&ForkResult),
) -> AgentRan {
    let mut progress = Progress {
        reservation_id: steps.input.reservation_id.clone(),
        ..Progress::default()
    };
    let agent = agent_then_verify(ctx, steps, &mut result, &mut progress, show).await;
    AgentRan {
        result,
        progress,
        agent,
    }
}

async fn agent_then_verify<W>(
    ctx: &WorkflowContext<W>,
    steps: &ForkSteps<'_>,
    result: &mut ForkResult,
    progress: &mut Progress,
    show: impl Fn(&ForkResult),
) -> Result<AgentEnd, StepFailure> {
    steps.cancelled()?;
    let out = match agent(ctx, steps).await {
        Ok(out) => out,
        Err((why, transcript_endpoint)) => {
            // The runner replica that ran the failed attempt still holds its transcript.
            if let Some(endpoint) = transcript_endpoint {
                result.transcript_endpoint = endpoint;
            }
            return Err(why);
        }
    };
    progress.cost_micros = out.cost_micros;
    progress.sandbox_charged_micros = out.sandbox_charged_micros;
    result.agent_exit_code = out.exit_code;
    result.agent_output_tail.clone_from(&out.output_tail);
    result.usage = out.usage;
    result.agent_duration_ms = out.duration_ms;
    result
        .transcript_endpoint
        .clone_from(&out.transcript_endpoint);
    result.cost_micros = out.cost_micros;
    result.agent_session.clone_from(&out.session_id);
    let end = AgentEnd {
        timed_out: out.timed_out,
        exit_code: out.exit_code,
        over_disk_limit: out.workspace_over_limit,
    };
    let agent_ok = !end.timed_out && end.exit_code == 0 && !end.over_disk_limit;
    if agent_ok && !steps.input.spec.verify_command.trim().is_empty() {
        result.phase = phase::VERIFYING.into();
        show(result);
        let out = verify(ctx, steps).await?;
        apply_verify(result, &out);
    }
    Ok(end)
}

/// The agent activity; a failure carries the transcript's endpoint when the runner
/// gave one.
async fn agent<W>(
    ctx: &WorkflowContext<W>,
    steps: &ForkSteps<'_>,
) -> Result<RunAgentResponse, (StepFailure, Option<String>)> {
    let (input, spec) = (steps.input, &steps.input.spec);
    let run = RunAgentRequest {
        run_id: input.run_id.clone(),
        fork: input.fork,
        sandbox_id: steps.sandbox.id.clone(),
        sandbox_endpoint: steps.sandbox.owner_endpoint.clone(),
        agent: spec.agent.clone(),
        prompt: input.prompt().to_owned(),
        timeout_secs: spec.fork_timeout_secs,
        reservation_id: input.reservation_id.clone(),
        charge_key: steps.key("agent"),
        attempt: input.attempt.max(1),
        output_tail_bytes: history_caps(spec).agent_tail,
        branch_of: input.branch.as_ref().map(|b| BranchOf {
            parent_fork: b.parent_fork,
            session: b.session.clone(),
        }),
    };
    let mut opts = options::agent(spec.fork_timeout_secs);
    opts.cancellation_token = Some(steps.cancel.clone());
    opts.activity_id = steps.activity_id("agent");
    ctx.execute_activity(Agent::run, run, opts)
        .await
        .map_err(|e| {
            let transcript = details::<AgentFailureDetails>(&e).map(|d| d.transcript_endpoint);
            (classify("run agent", &e), transcript)
        })
}

/// The verify command, on the sandbox owner's queue; only its output tails come back.
async fn verify<W>(
    ctx: &WorkflowContext<W>,
    steps: &ForkSteps<'_>,
) -> Result<ExecResponse, StepFailure> {
    let spec = &steps.input.spec;
    let exec = ExecRequest {
        sandbox_id: steps.sandbox.id.clone(),
        argv: vec!["sh".into(), "-c".into(), spec.verify_command.clone()],
        env: HashMap::new(),
        timeout_secs: spec.verify_timeout_secs,
        // Only the tails are kept (in the history, too).
        output_tail_bytes: history_caps(spec).verify_tail,
        ..Default::default()
    };
    let mut opts = options::verify(
        options::sandbox_queue(&steps.sandbox.owner_task_queue),
        spec.verify_timeout_secs,
    );
    opts.cancellation_token = Some(steps.cancel.clone());
    opts.activity_id = steps.activity_id("verify");
    // The activity of the sandbox's backend (`e2b.exec` runs it through E2B's envd; the
    // local one looks only among the replica's own sandboxes). Only runs that take
    // `Change::BackendPerRun` have sandboxes elsewhere than local: histories of earlier
    // builds schedule `local.exec` as before.
    let ran = if steps.sandbox.backend == "e2b" {
        ctx.execute_activity(E2bSandbox::exec, exec, opts).await
    } else {
        ctx.execute_activity(LocalSandbox::exec, exec, opts).await
    };
    ran.map_err(|e| classify("verify", &e))
}

fn apply_verify(result: &mut ForkResult, out: &ExecResponse) {
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

fn tail(s: &str) -> String {
    forkyard_common::text::tail(s, OUTPUT_TAIL_BYTES).to_owned()
}

/// What is left to do for a fork whose agent (and verify) ended, as the one finish
/// (`crate::lifecycle::finish`) takes it, whichever workflow runs it: `key_owner` as in
/// [`ForkSteps`].
pub(super) fn finish_item(
    input: &ForkInput,
    sandbox: &Sandbox,
    key_owner: &str,
    ran: &AgentRan,
) -> FinishItem {
    let key = |step: &str| step_key(key_owner, input.attempt, step);
    FinishItem {
        run_id: input.run_id.clone(),
        fork: input.fork,
        sandbox: AtOwner {
            endpoint: sandbox.owner_endpoint.clone(),
            sandbox_id: sandbox.id.clone(),
            reason: "fork finished".into(),
        },
        collect_patch: ran.agent.is_ok(),
        succeeds_with_patch: matches!(&ran.agent, Ok(end) if end.succeeded()),
        reservation_id: ran.progress.reservation_id.clone(),
        cost_micros: ran.progress.cost_micros,
        sandbox_charged_micros: ran.progress.sandbox_charged_micros,
        commit_key: key("commit"),
        release_key: key("release"),
        sandbox_lost: matches!(&ran.agent, Err(f) if f.names_lost()),
        // A run open for branches keeps each fork's end (fork trees), and a search each
        // fork's that a later round may branch.
        snapshot: input.spec.branch_window_secs > 0 || super::rounds::branched_later(input),
    }
}
