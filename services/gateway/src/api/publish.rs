//! PublishFork: one fork of a finished run delivered after the fact, by a workflow of
//! its own (`<run id>/publish-<fork>`) so that it happens once however often it is
//! asked; asked again, the first delivery's outcome is the answer.

use super::GatewayService;
use crate::{
    auth::Tenant,
    error::GatewayError,
    validate,
    workflows::{PublishWorkflow, deliver::delivery_input},
};
use forkyard_common::repo_location::{self, RepoLocation};
use forkyard_proto::{
    common::v1::{ForkResult, ForkStatus},
    gateway::v1::{PublishForkRequest, Run, RunState},
    queues,
};
use temporalio_client::{
    WorkflowGetResultOptions, WorkflowIdReusePolicy, WorkflowStartOptions,
    errors::WorkflowStartError,
};

/// The publish workflow of a run's fork.
pub(super) fn publish_id(run_id: &str, fork: u32) -> String {
    format!("{run_id}/publish-{fork}")
}

impl GatewayService {
    pub(super) async fn publish(
        &self,
        tenant: &Tenant,
        req: PublishForkRequest,
    ) -> Result<ForkResult, GatewayError> {
        let delivery = validate::publish_delivery(&req)?;
        let run = self.publishable(tenant, &req).await?;
        let spec = run.spec.clone().unwrap_or_default();
        let fork = req.fork;
        let input = delivery_input(&run, spec.tenant.clone(), &delivery, |f| {
            (f.fork == fork).then_some(req.pull_request)
        });
        let id = publish_id(&req.run_id, fork);
        let options = WorkflowStartOptions::new(queues::ORCHESTRATION, id.clone())
            .id_reuse_policy(WorkflowIdReusePolicy::RejectDuplicate)
            .build();
        match self
            .client
            .start_workflow(PublishWorkflow::run, input, options)
            .await
        {
            Ok(_) => tracing::info!(run_id = %req.run_id, fork, "fork publishing"),
            Err(WorkflowStartError::AlreadyStarted { .. }) => {
                tracing::info!(run_id = %req.run_id, fork, "fork published before; its outcome answers");
            }
            Err(e) => return Err(GatewayError::from_start(e)),
        }
        let done = self
            .client
            .get_workflow_handle::<PublishWorkflow>(id)
            .get_result(WorkflowGetResultOptions::default())
            .await
            .map_err(|e| GatewayError::Temporal(format!("publishing fork {fork}: {e}")))?;
        let mut result = self.fork_result(tenant, &req.run_id, fork).await?;
        result.delivered = done
            .forks
            .into_iter()
            .find(|(f, _)| *f == fork)
            .map(|(_, d)| d);
        Ok(result)
    }

    /// The run of a fork that may be published: ended, the fork succeeded, the
    /// repository remote.
    async fn publishable(
        &self,
        tenant: &Tenant,
        req: &PublishForkRequest,
    ) -> Result<Run, GatewayError> {
        let (state, ..) = self.describe(tenant, &req.run_id).await?;
        if matches!(
            state,
            RunState::Running | RunState::Paused | RunState::AwaitingBudget
        ) {
            return Err(GatewayError::FailedPrecondition(format!(
                "run {} is still running: a fork is published once its run has ended",
                req.run_id
            )));
        }
        let mut run = self.progress(&req.run_id).await?;
        run.run_id.clone_from(&req.run_id);
        let slot = Self::fork_slot(&run, req.fork)?;
        if slot.status != ForkStatus::Succeeded as i32 {
            return Err(GatewayError::FailedPrecondition(format!(
                "fork {} did not succeed: only a succeeded fork is published",
                req.fork
            )));
        }
        let repo = run
            .spec
            .as_ref()
            .map(|s| s.repo.as_str())
            .unwrap_or_default();
        if !matches!(repo_location::locate(repo), Ok(RepoLocation::Remote(_))) {
            return Err(GatewayError::FailedPrecondition(
                "the run's repository is a local path: only a remote repository's forks are pushed"
                    .into(),
            ));
        }
        Ok(run)
    }

    /// A fork published after its run ended: where it went (`None`: never published).
    pub(super) async fn published(
        &self,
        run_id: &str,
        fork: u32,
    ) -> Option<forkyard_proto::common::v1::Delivered> {
        let done = self
            .client
            .get_workflow_handle::<PublishWorkflow>(publish_id(run_id, fork))
            .get_result(WorkflowGetResultOptions::default())
            .await
            .ok()?;
        done.forks
            .into_iter()
            .find(|(f, _)| *f == fork)
            .map(|(_, d)| d)
    }
}
