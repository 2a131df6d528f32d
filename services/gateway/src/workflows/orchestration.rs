//! `SandboxOrchestrationWorkflow`: one run. Opens the run's ledger account, then keeps
//! at most `max_concurrent` `ForkWorkflow` children in flight until every fork has a
//! result. A failed fork is a result, not a crash of the run. The `progress` query
//! answers with every fork's state, also after the run has closed.

use super::{
    fork::{ForkInput, ForkWorkflow},
    options, unix_ms,
};
use forkyard_proto::{
    activities::Ledger,
    budget::v1::OpenAccountRequest,
    common::v1::{ForkResult, ForkStatus},
    gateway::v1::{Run, RunSpec},
};
use futures::future::{LocalBoxFuture, select_all};
use temporalio_macros::{workflow, workflow_methods};
use temporalio_workflow::{
    ChildWorkflowCancellationType, ChildWorkflowOptions, ParentClosePolicy, WorkflowContext,
    WorkflowContextView, WorkflowResult, WorkflowTermination,
};

#[workflow]
pub struct SandboxOrchestrationWorkflow {
    spec: RunSpec,
    forks: Vec<ForkResult>,
    started_unix_ms: i64,
    finished_unix_ms: i64,
    error: String,
}

#[workflow_methods]
impl SandboxOrchestrationWorkflow {
    #[init]
    pub fn new(_ctx: &WorkflowContextView, spec: RunSpec) -> Self {
        let forks = (1..=spec.forks)
            .map(|fork| ForkResult {
                fork,
                status: ForkStatus::Pending as i32,
                branch: format!("{}-fork-{fork}", spec.branch),
                ..Default::default()
            })
            .collect();
        Self {
            spec,
            forks,
            started_unix_ms: 0,
            finished_unix_ms: 0,
            error: String::new(),
        }
    }

    #[run(name = "SandboxOrchestrationWorkflow")]
    pub async fn run(ctx: &mut WorkflowContext<Self>) -> WorkflowResult<Run> {
        let run_id = ctx.workflow_id().to_owned();
        let spec = ctx.state(|s| s.spec.clone());
        let started = unix_ms(ctx.workflow_time());
        ctx.state_mut(|s| s.started_unix_ms = started);

        let open = OpenAccountRequest {
            account_id: run_id.clone(),
            budget_micros: spec.budget_micros,
            idempotency_key: format!("{run_id}/open-account"),
        };
        if let Err(e) = ctx
            .execute_activity(Ledger::open_account, open, options::ledger())
            .await
        {
            let msg = format!("open ledger account: {e}");
            ctx.state_mut(|s| {
                s.error.clone_from(&msg);
                for f in &mut s.forks {
                    f.status = ForkStatus::Failed as i32;
                    f.error.clone_from(&msg);
                }
            });
            return finish(ctx);
        }

        let forks = spec.forks.max(1);
        let reservation_micros = spec.budget_micros / i64::from(forks);
        let max_concurrent = spec.max_concurrent.clamp(1, forks) as usize;
        let cancel = ctx.cancellation_token();

        let mut next = 1u32;
        let mut in_flight: Vec<LocalBoxFuture<'_, (u32, ForkResult)>> = Vec::new();
        loop {
            while in_flight.len() < max_concurrent && next <= forks && !cancel.is_cancelled() {
                let fork = next;
                next += 1;
                let input = ForkInput {
                    run_id: run_id.clone(),
                    fork,
                    spec: spec.clone(),
                    reservation_micros,
                };
                let opts = ChildWorkflowOptions::builder()
                    .workflow_id(format!("{run_id}/fork-{fork}"))
                    .parent_close_policy(ParentClosePolicy::RequestCancel)
                    .cancel_type(ChildWorkflowCancellationType::WaitCancellationCompleted)
                    .build();
                ctx.state_mut(|s| s.forks[(fork - 1) as usize].status = ForkStatus::Running as i32);
                let ctx_ref = &*ctx;
                in_flight.push(Box::pin(async move {
                    let res = match ctx_ref
                        .start_child_workflow(ForkWorkflow::run, input, opts)
                        .await
                    {
                        Ok(started) => started.result().await.map_err(|e| e.to_string()),
                        Err(e) => Err(e.to_string()),
                    };
                    let result = res.unwrap_or_else(|e| ForkResult {
                        fork,
                        status: ForkStatus::Failed as i32,
                        error: e,
                        ..Default::default()
                    });
                    (fork, result)
                }));
            }
            if in_flight.is_empty() {
                break;
            }
            // select_all polls in index order, so completions are seen deterministically.
            let ((fork, result), _, rest) = select_all(in_flight).await;
            in_flight = rest;
            ctx.state_mut(|s| {
                let slot = &mut s.forks[(fork - 1) as usize];
                let branch = std::mem::take(&mut slot.branch);
                *slot = result;
                slot.fork = fork;
                if slot.branch.is_empty() {
                    slot.branch = branch;
                }
            });
        }

        drop(in_flight);
        if cancel.is_cancelled() {
            ctx.state_mut(|s| {
                for f in s
                    .forks
                    .iter_mut()
                    .filter(|f| f.status == ForkStatus::Pending as i32)
                {
                    f.status = ForkStatus::Cancelled as i32;
                    f.error = "run cancelled before the fork started".into();
                }
                s.finished_unix_ms = unix_ms(ctx.workflow_time());
            });
            return Err(WorkflowTermination::cancelled());
        }
        finish(ctx)
    }

    /// Every fork's state; patches included (the gateway strips them unless asked).
    #[query]
    pub fn progress(&self, _ctx: &WorkflowContextView) -> Run {
        self.snapshot()
    }
}

impl SandboxOrchestrationWorkflow {
    fn snapshot(&self) -> Run {
        let count =
            |st: ForkStatus| self.forks.iter().filter(|f| f.status == st as i32).count() as u32;
        Run {
            spec: Some(self.spec.clone()),
            forks: self.forks.clone(),
            cost_micros: self.forks.iter().map(|f| f.cost_micros).sum(),
            forks_succeeded: count(ForkStatus::Succeeded),
            forks_failed: self.forks.len() as u32
                - count(ForkStatus::Succeeded)
                - count(ForkStatus::Running)
                - count(ForkStatus::Pending),
            forks_running: count(ForkStatus::Running),
            started_unix_ms: self.started_unix_ms,
            finished_unix_ms: self.finished_unix_ms,
            error: self.error.clone(),
            ..Default::default()
        }
    }
}

fn finish(ctx: &WorkflowContext<SandboxOrchestrationWorkflow>) -> WorkflowResult<Run> {
    let now = unix_ms(ctx.workflow_time());
    Ok(ctx.state_mut(|s| {
        s.finished_unix_ms = now;
        s.snapshot()
    }))
}
