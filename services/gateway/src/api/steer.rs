//! Steering a live run: pause, resume, cancel it or one of its forks, raise its budget.

use super::GatewayService;
use crate::auth::Access;
use crate::{auth::Tenant, error::GatewayError, workflows::SandboxOrchestrationWorkflow};
use forkyard_proto::{
    common::v1::ForkStatus,
    gateway::v1::{RaiseBudgetResponse, Run, RunState},
};
use temporalio_client::{
    WorkflowCancelOptions, WorkflowExecuteUpdateOptions, WorkflowSignalOptions,
    errors::WorkflowUpdateError,
};

fn is_live(state: RunState) -> bool {
    matches!(
        state,
        RunState::Running | RunState::Paused | RunState::AwaitingBudget
    )
}

impl GatewayService {
    async fn live(&self, tenant: &Tenant, run_id: &str, action: &str) -> Result<(), GatewayError> {
        let (state, _, _) = self.describe(tenant, run_id, Access::Change).await?;
        if is_live(state) {
            Ok(())
        } else {
            Err(GatewayError::FailedPrecondition(format!(
                "cannot {action} run {run_id}: it already finished ({})",
                state.as_str_name()
            )))
        }
    }

    pub(super) async fn set_paused(
        &self,
        tenant: &Tenant,
        run_id: &str,
        paused: bool,
    ) -> Result<Run, GatewayError> {
        self.live(tenant, run_id, if paused { "pause" } else { "resume" })
            .await?;
        let handle = self.handle(run_id);
        let sent = if paused {
            handle
                .signal(
                    SandboxOrchestrationWorkflow::pause,
                    (),
                    WorkflowSignalOptions::default(),
                )
                .await
        } else {
            handle
                .signal(
                    SandboxOrchestrationWorkflow::resume,
                    (),
                    WorkflowSignalOptions::default(),
                )
                .await
        };
        sent.map_err(|e| GatewayError::from_interaction(run_id, e))?;
        self.reads.forget(run_id);
        tracing::info!(run_id, paused, "run pause state changed");
        self.run(tenant, run_id).await
    }

    pub(super) async fn cancel(
        &self,
        tenant: &Tenant,
        run_id: &str,
        reason: String,
    ) -> Result<(), GatewayError> {
        self.live(tenant, run_id, "cancel").await?;
        let reason = if reason.is_empty() {
            "cancelled through the gateway".to_owned()
        } else {
            reason
        };
        self.handle(run_id)
            .cancel(WorkflowCancelOptions::builder().reason(reason).build())
            .await
            .map_err(|e| GatewayError::from_interaction(run_id, e))?;
        self.reads.forget(run_id);
        tracing::info!(run_id, "run cancel requested");
        Ok(())
    }

    pub(super) async fn cancel_one_fork(
        &self,
        tenant: &Tenant,
        run_id: &str,
        fork: u32,
    ) -> Result<(), GatewayError> {
        if fork == 0 {
            return Err(GatewayError::field("fork", "forks are numbered from 1"));
        }
        self.live(tenant, run_id, "cancel a fork of").await?;
        let run = self.progress(run_id).await?;
        let slot = Self::fork_slot(&run, fork)?;
        let open = [ForkStatus::Pending as i32, ForkStatus::Running as i32];
        if !open.contains(&slot.status) {
            return Err(GatewayError::FailedPrecondition(format!(
                "fork {fork} already finished ({})",
                ForkStatus::try_from(slot.status)
                    .unwrap_or_default()
                    .as_str_name()
            )));
        }
        self.handle(run_id)
            .signal(
                SandboxOrchestrationWorkflow::cancel_fork,
                fork,
                WorkflowSignalOptions::default(),
            )
            .await
            .map_err(|e| GatewayError::from_interaction(run_id, e))?;
        self.reads.forget(run_id);
        tracing::info!(run_id, fork, "fork cancel requested");
        Ok(())
    }

    pub(super) async fn raise(
        &self,
        tenant: &Tenant,
        run_id: &str,
        amount_usd: &str,
    ) -> Result<RaiseBudgetResponse, GatewayError> {
        let amount = forkyard_proto::Usd::parse(amount_usd)
            .map_err(|e| GatewayError::field("amount_usd", e))?
            .micros();
        if amount == 0 {
            return Err(GatewayError::field("amount_usd", "must be more than 0"));
        }
        self.live(tenant, run_id, "raise the budget of").await?;
        let account = self
            .handle(run_id)
            .execute_update(
                SandboxOrchestrationWorkflow::raise_budget,
                amount,
                WorkflowExecuteUpdateOptions::default(),
            )
            .await
            .map_err(|e| match e {
                WorkflowUpdateError::NotFound(_) => GatewayError::RunNotFound(run_id.to_owned()),
                WorkflowUpdateError::Failed(f) => {
                    GatewayError::FailedPrecondition(format!("raise budget: {}", f.message))
                }
                other => GatewayError::Temporal(other.to_string()),
            })?;
        self.reads.forget(run_id);
        tracing::info!(
            run_id,
            amount_micros = amount,
            budget_micros = account.budget_micros,
            "run budget raised"
        );
        Ok(RaiseBudgetResponse {
            budget_micros: account.budget_micros,
            available_micros: account.available_micros,
        })
    }
}
