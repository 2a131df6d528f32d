//! `ForkWorkflow`: one fork of a run, from reservation to a destroyed sandbox.
//!
//! reserve budget → create sandbox → health check → run agent → verify (optional) →
//! collect patch → commit actual spend → destroy sandbox. Reserve and create run on a
//! detached cancellation scope: a cancel arriving while they are in flight cannot lose
//! what they made (a held reservation, a cloned sandbox); the cancel is honoured right
//! after them. Whatever happens once the sandbox exists (failure, cancel, budget) ends
//! with the sandbox destroyed and the reservation settled.

use super::{
    failure::{StepFailure, classify},
    options, phase, unix_ms,
};
use forkyard_proto::{
    activities::{Agent, Ledger, LocalSandbox},
    agent::v1::RunAgentRequest,
    budget::v1::{CommitRequest, ReleaseRequest, ReserveRequest},
    common::v1::{DiffStat, ForkResult, ForkStatus, VerifyStatus},
    gateway::v1::RunSpec,
    labels,
    sandbox::v1::{
        CollectPatchRequest, CreateSandboxRequest, DestroySandboxRequest, ExecRequest,
        HealthCheckRequest,
    },
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
}

#[workflow]
#[derive(Default)]
pub struct ForkWorkflow {
    result: ForkResult,
}

/// What the work steps produced before they stopped.
#[derive(Default)]
struct Progress {
    sandbox_id: Option<String>,
    /// The task queue of the provisioner replica that owns the sandbox.
    sandbox_queue: String,
    cost_micros: i64,
    /// The agent charges its model turns to this reservation as it goes.
    reservation_id: String,
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
        let mut result = ForkResult {
            fork: input.fork,
            status: ForkStatus::Running as i32,
            branch: format!("{}-fork-{}", input.spec.branch, input.fork),
            started_unix_ms: unix_ms(ctx.workflow_time()),
            phase: phase::RESERVING.into(),
            verify: VerifyStatus::NotRun as i32,
            ..Default::default()
        };
        sync(ctx, &result);

        let reserve = ReserveRequest {
            account_id: input.run_id.clone(),
            amount_micros: input.reservation_micros,
            holder: wf_id.clone(),
            idempotency_key: key("reserve"),
        };
        let reservation = match ctx
            .execute_local_activity(Ledger::reserve, reserve, options::ledger_detached())
            .await
        {
            Ok(r) => r,
            Err(e) => {
                let failure = classify("reserve budget", &e);
                if matches!(failure, StepFailure::BudgetExceeded(_)) {
                    // The parent re-queues the fork until the budget is raised.
                    result.phase = phase::AWAITING_BUDGET.into();
                } else {
                    result.phase = phase::DONE.into();
                }
                apply_failure(&mut result, failure);
                result.finished_unix_ms = unix_ms(ctx.workflow_time());
                sync(ctx, &result);
                return Ok(result);
            }
        };

        let mut progress = Progress {
            reservation_id: reservation.reservation_id.clone(),
            ..Progress::default()
        };
        if let Err(f) = work(ctx, &input, &key, &mut result, &mut progress).await {
            apply_failure(&mut result, f);
        }
        result.phase = phase::CLEANUP.into();
        sync(ctx, &result);
        settle(
            ctx,
            &key,
            &reservation.reservation_id,
            &progress,
            &mut result,
        )
        .await;

        if let Some(sandbox_id) = progress.sandbox_id {
            let destroy = DestroySandboxRequest {
                sandbox_id,
                reason: "fork finished".into(),
            };
            if let Err(e) = ctx
                .execute_activity(
                    LocalSandbox::destroy,
                    destroy,
                    options::destroy(&progress.sandbox_queue),
                )
                .await
            {
                // Its owning workflow closes next: the janitor's sweep reaps it.
                let msg = failure_message(classify("destroy sandbox", &e));
                if result.error.is_empty() {
                    result.error = msg;
                }
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

/// Commit what the agent spent, or release the reservation if it spent nothing.
async fn settle(
    ctx: &WorkflowContext<ForkWorkflow>,
    key: &impl Fn(&str) -> String,
    reservation_id: &str,
    progress: &Progress,
    result: &mut ForkResult,
) {
    if progress.cost_micros > 0 || result.status == ForkStatus::Succeeded as i32 {
        let commit = CommitRequest {
            reservation_id: reservation_id.to_owned(),
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
            reservation_id: reservation_id.to_owned(),
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

fn failure_message(f: StepFailure) -> String {
    match f {
        StepFailure::Cancelled => "cancelled".to_owned(),
        StepFailure::BudgetExceeded(m) | StepFailure::Failed(m) => m,
    }
}

fn apply_failure(result: &mut ForkResult, f: StepFailure) {
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
    key: &impl Fn(&str) -> String,
    result: &mut ForkResult,
    progress: &mut Progress,
) -> Result<(), StepFailure> {
    let spec = &input.spec;
    cancelled(ctx)?;
    set_phase(ctx, phase::CREATING);
    let create = CreateSandboxRequest {
        backend: "local".into(),
        repo: spec.repo.clone(),
        base_ref: spec.base_ref.clone(),
        branch: result.branch.clone(),
        labels: HashMap::from([
            (labels::RUN_ID.to_owned(), input.run_id.clone()),
            (labels::FORK.to_owned(), input.fork.to_string()),
            (labels::WORKFLOW_ID.to_owned(), ctx.workflow_id().to_owned()),
        ]),
        idempotency_key: key("create"),
        network: false,
        ..Default::default()
    };
    let sandbox = ctx
        .execute_activity(LocalSandbox::create, create, options::create())
        .await
        .map_err(|e| classify("create sandbox", &e))?;
    progress.sandbox_id = Some(sandbox.id.clone());
    progress.sandbox_queue = options::sandbox_queue(&sandbox.owner_task_queue).to_owned();
    result.sandbox_id.clone_from(&sandbox.id);
    result.base_commit.clone_from(&sandbox.base_commit);
    sync(ctx, result);
    cancelled(ctx)?;

    set_phase(ctx, phase::CHECKING);
    let health = ctx
        .execute_activity(
            LocalSandbox::health,
            HealthCheckRequest {
                sandbox_id: sandbox.id.clone(),
            },
            options::health(options::sandbox_queue(&sandbox.owner_task_queue)),
        )
        .await
        .map_err(|e| classify("health check", &e))?;
    if !health.healthy {
        return Err(StepFailure::Failed(format!(
            "health check: {}",
            health.detail
        )));
    }
    result.sandbox_ready_unix_ms = unix_ms(ctx.workflow_time());
    result.phase = phase::AGENT.into();
    sync(ctx, result);

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
    let agent_out = ctx
        .execute_activity(Agent::run, run, options::agent(spec.fork_timeout_secs))
        .await
        .map_err(|e| classify("run agent", &e))?;
    progress.cost_micros = agent_out.cost_micros;
    result.agent_exit_code = agent_out.exit_code;
    result.agent_output_tail = agent_out.output_tail.clone();
    result.usage = agent_out.usage;
    result.agent_duration_ms = agent_out.duration_ms;
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
        .execute_activity(
            LocalSandbox::collect_patch,
            CollectPatchRequest {
                sandbox_id: sandbox.id.clone(),
                max_bytes: 0,
            },
            options::collect_patch(options::sandbox_queue(&sandbox.owner_task_queue)),
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
