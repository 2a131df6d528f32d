//! Reading a run: Temporal's description of it, its progress query, and the view
//! GetRun and WatchRun serve.

use super::{GatewayService, run_reads::View, run_state::run_state};
use crate::{
    auth::{Access, DEFAULT_TENANT, Tenant},
    error::GatewayError,
    search, validate,
    workflows::{ORCHESTRATION_WORKFLOW, SandboxOrchestrationWorkflow},
};
use forkyard_common::clock::unix_ms;
use forkyard_proto::gateway::v1::{Run, RunState};
use temporalio_client::{WorkflowDescribeOptions, WorkflowGetResultOptions, WorkflowQueryOptions};

/// Another tenant's run is NOT_FOUND, exactly like a run that does not exist; an admin
/// reads it, and is told it may not change it (it knows the run is there).
fn check_owner(
    tenant: &Tenant,
    run_id: &str,
    owner: &str,
    access: Access,
) -> Result<(), GatewayError> {
    if !tenant.authenticated || owner == tenant.name {
        return Ok(());
    }
    match (tenant.admin, access) {
        (true, Access::Read) => Ok(()),
        (true, Access::Change) => Err(GatewayError::PermissionDenied(format!(
            "run {run_id} is tenant {owner}'s: admin tenant {} reads every tenant's runs \
             and changes only its own",
            tenant.name
        ))),
        (false, _) => Err(GatewayError::RunNotFound(run_id.to_owned())),
    }
}

struct Described {
    state: RunState,
    started: i64,
    finished: i64,
    owner: String,
}

impl GatewayService {
    pub(super) fn handle(
        &self,
        run_id: &str,
    ) -> temporalio_client::WorkflowHandle<temporalio_client::Client, SandboxOrchestrationWorkflow>
    {
        self.client
            .get_workflow_handle::<SandboxOrchestrationWorkflow>(run_id)
    }

    /// Temporal's view of the run: closed state, start and close time. Another tenant's
    /// run is NOT_FOUND, exactly like a run that does not exist, so ids do not leak.
    pub(super) async fn describe(
        &self,
        tenant: &Tenant,
        run_id: &str,
        access: Access,
    ) -> Result<(RunState, i64, i64), GatewayError> {
        validate::check_run_id(run_id)?;
        let d = self.describe_any(run_id).await?;
        check_owner(tenant, run_id, &d.owner, access)?;
        Ok((d.state, d.started, d.finished))
    }

    /// [`Self::describe`] for whichever tenant owns the run (named in `owner`).
    async fn describe_any(&self, run_id: &str) -> Result<Described, GatewayError> {
        let desc = self
            .handle(run_id)
            .describe(WorkflowDescribeOptions::default())
            .await
            .map_err(|e| GatewayError::from_interaction(run_id, e))?;
        if desc.workflow_type() != ORCHESTRATION_WORKFLOW {
            return Err(GatewayError::RunNotFound(run_id.to_owned()));
        }
        // Runs from before tenancy carry no tenant: they are the default tenant's.
        let owner = desc
            .search_attributes()
            .get(&search::TENANT_ATTR)
            .unwrap_or_else(|| DEFAULT_TENANT.to_owned());
        Ok(Described {
            state: run_state(desc.status()),
            started: unix_ms(desc.start_time()),
            finished: unix_ms(desc.close_time()),
            owner,
        })
    }

    pub(super) async fn progress(&self, run_id: &str) -> Result<Run, GatewayError> {
        self.handle(run_id)
            .query(
                SandboxOrchestrationWorkflow::progress,
                (),
                WorkflowQueryOptions::default(),
            )
            .await
            .map_err(|e| GatewayError::from_query(run_id, e))
    }

    /// The run with its forks' compact state (no patches, no output tails), through the
    /// read cache (`run_reads`).
    pub(super) async fn run(&self, tenant: &Tenant, run_id: &str) -> Result<Run, GatewayError> {
        validate::check_run_id(run_id)?;
        let svc = self.clone();
        let id = run_id.to_owned();
        let view = self
            .reads
            .get(run_id, async move { svc.fetch_view(&id).await })
            .await?;
        check_owner(tenant, run_id, &view.owner, Access::Read)?;
        Ok(view.run.clone())
    }

    /// The run as Temporal has it now. A completed run's view is its workflow's result
    /// (a history read); a running one, or one that ended otherwise (it has no result),
    /// is asked with the `progress` query.
    async fn fetch_view(&self, run_id: &str) -> Result<View, GatewayError> {
        let Described {
            state,
            started,
            finished,
            owner,
        } = self.describe_any(run_id).await?;
        let result = if state == RunState::Completed {
            self.handle(run_id)
                .get_result(WorkflowGetResultOptions::default())
                .await
                .ok()
        } else {
            None
        };
        let mut run = match result {
            Some(run) => run,
            None => self.progress(run_id).await?,
        };
        run.run_id = run_id.to_owned();
        // While it runs, the workflow knows best (paused, awaiting budget); once it
        // closed, Temporal's status says how.
        if state != RunState::Running {
            run.state = state as i32;
        }
        let mut publishable = false;
        if state == RunState::Completed {
            let (outcome, why) = crate::workflows::outcome(&run);
            run.state = outcome as i32;
            if run.error.is_empty() {
                run.error = why;
            }
        }
        // A fork of a run that ended, however, may be published (PublishFork).
        if state != RunState::Running && super::publish::may_publish(&run) {
            self.attach_published(&mut run).await;
            publishable = super::publish::may_publish(&run);
        }
        if run.started_unix_ms == 0 {
            run.started_unix_ms = started;
        }
        if run.finished_unix_ms == 0 {
            run.finished_unix_ms = finished;
        }
        Ok(View {
            owner,
            run,
            closed: state != RunState::Running,
            publishable,
        })
    }
}
