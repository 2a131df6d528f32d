//! GetForkResult: one fork in full, from wherever it is kept at the time.

use super::GatewayService;
use crate::auth::Access;
use crate::{
    auth::Tenant,
    error::GatewayError,
    workflows::{FORK_WORKFLOW, ForkWorkflow, SandboxOrchestrationWorkflow},
};
use forkyard_proto::{
    common::v1::{ForkResult, ForkStatus},
    gateway::v1::Run,
};
use temporalio_client::{
    WorkflowDescribeOptions, WorkflowExecutionStatus, WorkflowGetResultOptions,
    WorkflowQueryOptions, errors::WorkflowGetResultError,
};

impl GatewayService {
    pub(super) fn fork_slot(run: &Run, fork: u32) -> Result<&ForkResult, GatewayError> {
        if fork == 0 {
            return Err(GatewayError::field("fork", "forks are numbered from 1"));
        }
        run.forks.get(fork as usize - 1).ok_or_else(|| {
            GatewayError::NotFound(format!(
                "fork {fork} not found: the run has {} forks",
                run.forks.len()
            ))
        })
    }

    /// A fork in full: from its child's result once it finished, from the child's
    /// progress query while it runs, from the run while it has not started. An inline
    /// fork (no child) comes from the run: its full result once it finished, its compact
    /// progress until then.
    pub(super) async fn fork_result(
        &self,
        tenant: &Tenant,
        run_id: &str,
        fork: u32,
    ) -> Result<ForkResult, GatewayError> {
        self.describe(tenant, run_id, Access::Read).await?;
        let run = self.progress(run_id).await?;
        let slot = Self::fork_slot(&run, fork)?.clone();
        if slot.status == ForkStatus::Pending as i32
            && slot.sandbox_id.is_empty()
            && slot.started_unix_ms == 0
        {
            return Ok(slot);
        }
        let child = self.client.get_workflow_handle::<ForkWorkflow>(
            forkyard_proto::ids::ForkId::new(run_id, fork).to_string(),
        );
        let desc = match child.describe(WorkflowDescribeOptions::default()).await {
            Ok(d) if d.workflow_type() == FORK_WORKFLOW => d,
            // Inline, or never started (cancelled while pending): the run has it.
            _ => {
                let full = self
                    .handle(run_id)
                    .query(
                        SandboxOrchestrationWorkflow::fork_result,
                        fork,
                        WorkflowQueryOptions::default(),
                    )
                    .await
                    .map_err(|e| GatewayError::from_query(run_id, e))?;
                return Ok(full.unwrap_or(slot));
            }
        };
        if desc.status() == WorkflowExecutionStatus::Running {
            return child
                .query(ForkWorkflow::progress, (), WorkflowQueryOptions::default())
                .await
                .map_err(|e| GatewayError::from_query(run_id, e));
        }
        match child.get_result(WorkflowGetResultOptions::default()).await {
            // Where the run delivered it came after the child ended: the run has it.
            Ok(full) => Ok(ForkResult {
                delivered: full.delivered.or(slot.delivered),
                ..full
            }),
            Err(WorkflowGetResultError::NotFound(_)) => Ok(slot),
            // Terminated or failed children have no result: the run's copy says why.
            Err(_) => Ok(slot),
        }
    }

    /// Fill in the fork's transcript from the runner; a fork that never started has none.
    pub(super) async fn attach_transcript(&self, run_id: &str, result: &mut ForkResult) {
        if let Some(link) = &self.agent_runner
            && (result.started_unix_ms > 0 || !result.sandbox_id.is_empty())
        {
            result.transcript = link
                .transcript(run_id, result.fork, &result.transcript_endpoint)
                .await;
        }
    }
}
