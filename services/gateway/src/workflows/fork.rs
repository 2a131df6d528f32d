//! `ForkWorkflow`: one fork of a run, from reservation to a destroyed sandbox.
//!
//! reserve budget → create sandbox → health check → run agent → collect patch →
//! commit actual spend; whatever happens after the sandbox exists (failure, cancel,
//! budget exhausted) ends with the sandbox destroyed and the reservation settled.

use super::{
    failure::{StepFailure, classify},
    options, unix_ms,
};
use forkyard_proto::{
    activities::{Agent, Ledger, LocalSandbox},
    agent::v1::RunAgentRequest,
    budget::v1::{CommitRequest, ReleaseRequest, ReserveRequest},
    common::v1::{DiffStat, ForkResult, ForkStatus},
    gateway::v1::RunSpec,
    labels,
    sandbox::v1::{
        CollectPatchRequest, CreateSandboxRequest, DestroySandboxRequest, HealthCheckRequest,
    },
};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use temporalio_macros::{workflow, workflow_methods};
use temporalio_workflow::{WorkflowContext, WorkflowResult};

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct ForkInput {
    pub run_id: String,
    pub fork: u32,
    pub spec: RunSpec,
    /// What this fork may spend, reserved in the run's ledger account before it starts.
    pub reservation_micros: i64,
}

#[workflow]
#[derive(Default)]
pub struct ForkWorkflow;

/// What the work steps produced before they stopped.
#[derive(Default)]
struct Progress {
    sandbox_id: Option<String>,
    cost_micros: i64,
}

#[workflow_methods]
impl ForkWorkflow {
    #[run(name = "ForkWorkflow")]
    pub async fn run(
        ctx: &mut WorkflowContext<Self>,
        input: ForkInput,
    ) -> WorkflowResult<ForkResult> {
        let wf_id = ctx.workflow_id().to_owned();
        let mut result = ForkResult {
            fork: input.fork,
            status: ForkStatus::Running as i32,
            branch: format!("{}-fork-{}", input.spec.branch, input.fork),
            started_unix_ms: unix_ms(ctx.workflow_time()),
            ..Default::default()
        };

        let reserve = ReserveRequest {
            account_id: input.run_id.clone(),
            amount_micros: input.reservation_micros,
            holder: wf_id.clone(),
            idempotency_key: format!("{wf_id}/reserve"),
        };
        let reservation = match ctx
            .execute_activity(Ledger::reserve, reserve, options::ledger())
            .await
        {
            Ok(r) => r,
            Err(e) => {
                apply_failure(&mut result, classify("reserve budget", &e));
                result.finished_unix_ms = unix_ms(ctx.workflow_time());
                return Ok(result);
            }
        };

        let mut progress = Progress::default();
        let outcome = work(ctx, &input, &wf_id, &mut result, &mut progress).await;
        match outcome {
            Ok(()) => {}
            Err(f) => apply_failure(&mut result, f),
        }

        // Settle the money first (cheap), then destroy; both survive a cancelled workflow.
        if progress.cost_micros > 0 || result.status == ForkStatus::Succeeded as i32 {
            let commit = CommitRequest {
                reservation_id: reservation.reservation_id.clone(),
                amount_micros: progress.cost_micros,
                idempotency_key: format!("{wf_id}/commit"),
            };
            match ctx
                .execute_activity(Ledger::commit, commit, options::ledger_detached())
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
                    let msg = match classify("commit spend", &e) {
                        StepFailure::Cancelled => "commit spend: cancelled".to_owned(),
                        StepFailure::BudgetExceeded(m) | StepFailure::Failed(m) => m,
                    };
                    result.status = ForkStatus::Failed as i32;
                    result.error = msg;
                }
            }
        } else {
            let release = ReleaseRequest {
                reservation_id: reservation.reservation_id.clone(),
                idempotency_key: format!("{wf_id}/release"),
            };
            // A failed release leaves a HELD reservation the janitor releases later.
            let _ = ctx
                .execute_activity(Ledger::release, release, options::ledger_detached())
                .await;
        }

        if let Some(sandbox_id) = progress.sandbox_id {
            let destroy = DestroySandboxRequest {
                sandbox_id,
                reason: "fork finished".into(),
            };
            if let Err(e) = ctx
                .execute_activity(LocalSandbox::destroy, destroy, options::destroy())
                .await
            {
                // The janitor reaps it: the sandbox's owning workflow is about to close.
                let msg = match classify("destroy sandbox", &e) {
                    StepFailure::Cancelled => "destroy sandbox: cancelled".to_owned(),
                    StepFailure::BudgetExceeded(m) | StepFailure::Failed(m) => m,
                };
                if result.error.is_empty() {
                    result.error = msg;
                }
            }
        }
        result.finished_unix_ms = unix_ms(ctx.workflow_time());
        Ok(result)
    }
}

fn apply_failure(result: &mut ForkResult, f: StepFailure) {
    let (status, msg) = match f {
        StepFailure::Cancelled => (ForkStatus::Cancelled, "cancelled".to_owned()),
        StepFailure::BudgetExceeded(m) => (ForkStatus::BudgetExceeded, m),
        StepFailure::Failed(m) => (ForkStatus::Failed, m),
    };
    result.status = status as i32;
    result.error = msg;
}

async fn work(
    ctx: &mut WorkflowContext<ForkWorkflow>,
    input: &ForkInput,
    wf_id: &str,
    result: &mut ForkResult,
    progress: &mut Progress,
) -> Result<(), StepFailure> {
    let spec = &input.spec;
    let create = CreateSandboxRequest {
        backend: "local".into(),
        repo: spec.repo.clone(),
        base_ref: spec.base_ref.clone(),
        branch: result.branch.clone(),
        labels: HashMap::from([
            (labels::RUN_ID.to_owned(), input.run_id.clone()),
            (labels::FORK.to_owned(), input.fork.to_string()),
            (labels::WORKFLOW_ID.to_owned(), wf_id.to_owned()),
        ]),
        idempotency_key: format!("{wf_id}/create"),
        network: false,
    };
    let sandbox = ctx
        .execute_activity(LocalSandbox::create, create, options::create())
        .await
        .map_err(|e| classify("create sandbox", &e))?;
    progress.sandbox_id = Some(sandbox.id.clone());
    result.sandbox_id.clone_from(&sandbox.id);
    result.base_commit.clone_from(&sandbox.base_commit);

    let health = ctx
        .execute_activity(
            LocalSandbox::health,
            HealthCheckRequest {
                sandbox_id: sandbox.id.clone(),
            },
            options::health(),
        )
        .await
        .map_err(|e| classify("health check", &e))?;
    if !health.healthy {
        return Err(StepFailure::Failed(format!(
            "health check: {}",
            health.detail
        )));
    }

    let run = RunAgentRequest {
        run_id: input.run_id.clone(),
        fork: input.fork,
        sandbox_id: sandbox.id.clone(),
        sandbox_endpoint: sandbox.owner_endpoint.clone(),
        agent: spec.agent.clone(),
        prompt: spec.prompt.clone(),
        timeout_secs: spec.fork_timeout_secs,
    };
    let agent_out = ctx
        .execute_activity(Agent::run, run, options::agent(spec.fork_timeout_secs))
        .await
        .map_err(|e| classify("run agent", &e))?;
    progress.cost_micros = agent_out.cost_micros;
    result.agent_exit_code = agent_out.exit_code;
    result.agent_output_tail = agent_out.output_tail.clone();
    result.usage = agent_out.usage;

    // The patch is collected even from a failed agent: it shows what it did.
    let patch = ctx
        .execute_activity(
            LocalSandbox::collect_patch,
            CollectPatchRequest {
                sandbox_id: sandbox.id.clone(),
                max_bytes: 0,
            },
            options::collect_patch(),
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
