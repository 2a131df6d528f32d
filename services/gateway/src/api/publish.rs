//! PublishFork: one fork of a finished run delivered after the fact, by a workflow of
//! its own (`<run id>/publish-<fork>`) so that it happens once however often it is
//! asked; asked again, the first delivery's outcome is the answer. The run's view
//! (GetRun, WatchRun) and the fork's result show it as they show the run's own
//! deliveries.

use super::GatewayService;
use crate::auth::Access;
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
use futures::StreamExt as _;
use temporalio_client::{
    WorkflowDescribeOptions, WorkflowExecutionStatus, WorkflowGetResultOptions,
    WorkflowIdReusePolicy, WorkflowListOptions, WorkflowStartOptions, errors::WorkflowStartError,
};

/// The publish workflow's type (`PublishWorkflow`'s `run`).
const PUBLISH_WORKFLOW: &str = "PublishWorkflow";

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
        // This replica's next GetRun shows it at once (others within `published_ttl`).
        let delivered = result.delivered.clone();
        self.reads.amend(&req.run_id, |run| {
            if let Some(f) = run.forks.get_mut((fork as usize).wrapping_sub(1)) {
                f.delivered = f.delivered.take().or(delivered);
            }
        });
        Ok(result)
    }

    /// The run of a fork that may be published: ended, the fork succeeded, the
    /// repository remote.
    async fn publishable(
        &self,
        tenant: &Tenant,
        req: &PublishForkRequest,
    ) -> Result<Run, GatewayError> {
        let (state, ..) = self.describe(tenant, &req.run_id, Access::Change).await?;
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

    /// A fork published after its run ended: where it went (`None`: never published, or
    /// not yet: a read never waits for a publication's push or forge).
    pub(super) async fn published(
        &self,
        run_id: &str,
        fork: u32,
    ) -> Option<forkyard_proto::common::v1::Delivered> {
        let desc = self
            .client
            .get_workflow_handle::<PublishWorkflow>(publish_id(run_id, fork))
            .describe(WorkflowDescribeOptions::default())
            .await
            .ok()?;
        if desc.status() != WorkflowExecutionStatus::Completed {
            return None;
        }
        self.publish_outcome(run_id, fork).await
    }

    /// Where a completed publication of the fork went.
    async fn publish_outcome(
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

    /// A run's forks published after it ended, onto its view: one visibility
    /// list of its completed publish workflows, and each one's outcome. A list that fails
    /// leaves the view as the run left it (logged); the view is fetched again later.
    pub(super) async fn attach_published(&self, run: &mut Run) {
        if run.run_id.contains(['\'', '\\']) {
            return;
        }
        let query = format!(
            "WorkflowType = '{PUBLISH_WORKFLOW}' AND WorkflowId STARTS_WITH '{}/publish-' AND ExecutionStatus = 'Completed'",
            run.run_id
        );
        let options = WorkflowListOptions::builder()
            .limit(run.forks.len())
            .build();
        let mut listed = self.client.list_workflows(query, options);
        let mut forks = Vec::new();
        while let Some(item) = listed.next().await {
            match item {
                Ok(wf) => forks.extend(publish_fork_of(wf.id(), &run.run_id)),
                Err(e) => {
                    tracing::warn!(run_id = %run.run_id, error = %e, "published forks not listed");
                    break;
                }
            }
        }
        for fork in forks {
            let Some(slot) = run.forks.get_mut((fork as usize).wrapping_sub(1)) else {
                continue;
            };
            if slot.delivered.is_none() {
                slot.delivered = self.publish_outcome(&run.run_id, fork).await;
            }
        }
    }
}

/// The fork a publish workflow id (`<run id>/publish-<fork>`) of `run_id` names.
fn publish_fork_of(workflow_id: &str, run_id: &str) -> Option<u32> {
    workflow_id
        .strip_prefix(run_id)?
        .strip_prefix("/publish-")?
        .parse()
        .ok()
}

/// Whether a fork of the ended `run` may still be published and show on its view: the
/// repository is remote and a succeeded fork has not been delivered.
pub(super) fn may_publish(run: &Run) -> bool {
    let repo = run
        .spec
        .as_ref()
        .map(|s| s.repo.as_str())
        .unwrap_or_default();
    matches!(repo_location::locate(repo), Ok(RepoLocation::Remote(_)))
        && run
            .forks
            .iter()
            .any(|f| f.status == ForkStatus::Succeeded as i32 && f.delivered.is_none())
}
