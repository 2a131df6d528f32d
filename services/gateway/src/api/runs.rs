//! Launching, reading, listing and steering runs and forks.

use super::{GatewayService, run_reads::View};
use crate::{
    auth::{DEFAULT_TENANT, Tenant},
    error::GatewayError,
    money::parse_usd,
    search, validate,
    workflows::{
        FORK_WORKFLOW, ForkWorkflow, ORCHESTRATION_WORKFLOW, SandboxOrchestrationWorkflow,
    },
};
use forkyard_proto::{
    common::v1::{ForkResult, ForkStatus},
    gateway::v1::{
        LaunchRunRequest, LaunchRunResponse, ListRunsRequest, ListRunsResponse,
        RaiseBudgetResponse, Run, RunState, RunSummary,
    },
    queues,
};
use futures::StreamExt;
use temporalio_client::{
    WorkflowCancelOptions, WorkflowDescribeOptions, WorkflowExecuteUpdateOptions,
    WorkflowExecutionStatus, WorkflowGetResultOptions, WorkflowIdReusePolicy, WorkflowListOptions,
    WorkflowQueryOptions, WorkflowSignalOptions, WorkflowStartOptions,
    errors::{WorkflowGetResultError, WorkflowStartError, WorkflowUpdateError},
};
use temporalio_common::search_attributes::SearchAttributes;

/// Most runs one ListRuns page may skip; deeper paging needs a narrower filter.
const MAX_LIST_OFFSET: usize = 100_000;

use forkyard_common::clock::unix_ms;

/// The API state of a closed (or running) workflow execution.
pub fn run_state(s: WorkflowExecutionStatus) -> RunState {
    match s {
        WorkflowExecutionStatus::Running | WorkflowExecutionStatus::Paused => RunState::Running,
        WorkflowExecutionStatus::Completed | WorkflowExecutionStatus::ContinuedAsNew => {
            RunState::Completed
        }
        WorkflowExecutionStatus::Failed => RunState::Failed,
        WorkflowExecutionStatus::Canceled => RunState::Cancelled,
        WorkflowExecutionStatus::Terminated => RunState::Terminated,
        WorkflowExecutionStatus::TimedOut => RunState::TimedOut,
        _ => RunState::Unspecified,
    }
}

/// Another tenant's run is NOT_FOUND, exactly like a run that does not exist.
fn check_owner(tenant: &Tenant, run_id: &str, owner: &str) -> Result<(), GatewayError> {
    if tenant.authenticated && owner != tenant.name {
        return Err(GatewayError::RunNotFound(run_id.to_owned()));
    }
    Ok(())
}

struct Described {
    state: RunState,
    started: i64,
    finished: i64,
    owner: String,
}

fn is_live(state: RunState) -> bool {
    matches!(
        state,
        RunState::Running | RunState::Paused | RunState::AwaitingBudget
    )
}

impl GatewayService {
    fn handle(
        &self,
        run_id: &str,
    ) -> temporalio_client::WorkflowHandle<temporalio_client::Client, SandboxOrchestrationWorkflow>
    {
        self.client
            .get_workflow_handle::<SandboxOrchestrationWorkflow>(run_id)
    }

    /// Temporal's view of the run: closed state, start and close time. Another tenant's
    /// run is NOT_FOUND, exactly like a run that does not exist, so ids do not leak.
    async fn describe(
        &self,
        tenant: &Tenant,
        run_id: &str,
    ) -> Result<(RunState, i64, i64), GatewayError> {
        validate::check_run_id(run_id)?;
        let d = self.describe_any(run_id).await?;
        check_owner(tenant, run_id, &d.owner)?;
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

    pub(super) async fn launch(
        &self,
        tenant: &Tenant,
        req: LaunchRunRequest,
    ) -> Result<LaunchRunResponse, GatewayError> {
        let mut spec = validate::launch_spec(&req, &self.limits)?;
        self.check_agent(&spec).await?;
        let run_id = if req.request_id.is_empty() {
            format!("run-{}", uuid::Uuid::new_v4().simple())
        } else {
            validate::run_id_for(&req.request_id)?;
            tenant.run_id_for(&req.request_id)
        };
        spec.repo = self.tenancy.repos.check(&spec.repo)?;
        spec.egress = self.tenancy.egress.check(&tenant.name, &req.egress)?;
        validate::check_repo(&spec.repo, &spec.base_ref).await?;
        spec.tenant.clone_from(&tenant.name);
        self.check_fork_slots(tenant, spec.max_concurrent.min(spec.forks))
            .await?;
        spec.tenant_account_id = self.tenant_account(tenant).await?.unwrap_or_default();

        // RejectDuplicate: a request id names one run forever, even after it closed.
        // Eager start: this gateway's own worker (it polls the orchestration queue) takes
        // the run's first workflow task from the start's answer, with no trip through
        // matching; when it has no free slot, the server dispatches the task as usual.
        let opts = WorkflowStartOptions::new(queues::ORCHESTRATION, run_id.clone())
            .id_reuse_policy(WorkflowIdReusePolicy::RejectDuplicate)
            .enable_eager_workflow_start(true)
            .search_attributes(SearchAttributes::new([
                crate::workflows::LABELS_ATTR.value_set({
                    let mut l: Vec<String> = spec
                        .labels
                        .iter()
                        .map(|(k, v)| format!("{k}={v}"))
                        .collect();
                    l.sort();
                    l
                }),
                search::TENANT_ATTR.value_set(tenant.name.clone()),
                search::FORK_SLOTS_ATTR.value_set(i64::from(spec.max_concurrent.min(spec.forks))),
            ]))
            .build();
        let forks = spec.forks;
        match self
            .client
            .start_workflow(SandboxOrchestrationWorkflow::run, spec.clone(), opts)
            .await
        {
            Ok(_) => {
                tracing::info!(run_id, forks, "run launched");
                Ok(LaunchRunResponse {
                    run_id,
                    created: true,
                })
            }
            Err(WorkflowStartError::AlreadyStarted { .. }) => {
                // Same request id: the same run, as long as it is the same request.
                let existing = self.progress(&run_id).await?;
                if existing.spec.as_ref() != Some(&spec) {
                    return Err(GatewayError::AlreadyExists(format!(
                        "request_id: {:?} already launched {run_id} with a different request",
                        req.request_id
                    )));
                }
                tracing::info!(run_id, "launch replayed; run already exists");
                Ok(LaunchRunResponse {
                    run_id,
                    created: false,
                })
            }
            Err(e) => Err(GatewayError::from_start(e)),
        }
    }

    async fn progress(&self, run_id: &str) -> Result<Run, GatewayError> {
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
        check_owner(tenant, run_id, &view.owner)?;
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
        if state == RunState::Completed {
            let (outcome, why) = crate::workflows::outcome(&run);
            run.state = outcome as i32;
            if run.error.is_empty() {
                run.error = why;
            }
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
        })
    }

    pub(super) async fn list(
        &self,
        tenant: &Tenant,
        req: ListRunsRequest,
    ) -> Result<ListRunsResponse, GatewayError> {
        let page_size = match req.page_size {
            0 => 50,
            n if n > 1000 => return Err(GatewayError::field("page_size", "at most 1000")),
            n => n as usize,
        };
        let offset: usize = if req.page_token.is_empty() {
            0
        } else {
            req.page_token
                .parse()
                .ok()
                .filter(|o| *o <= MAX_LIST_OFFSET)
                .ok_or_else(|| GatewayError::field("page_token", "is not a token from ListRuns"))?
        };
        let state = RunState::try_from(req.state)
            .map_err(|_| GatewayError::field("state", "unknown run state"))?;
        let query = search::list_query_for(
            tenant.authenticated.then_some(tenant.name.as_str()),
            state,
            &req.labels,
        )?;
        let mut stream = self
            .client
            .list_workflows(
                query,
                WorkflowListOptions::builder()
                    .limit(offset + page_size + 1)
                    .build(),
            )
            .skip(offset);
        let mut runs = Vec::new();
        let mut more = false;
        while let Some(item) = stream.next().await {
            let wf = item.map_err(|e| GatewayError::Temporal(e.to_string()))?;
            if runs.len() == page_size {
                more = true;
                break;
            }
            let mut state = run_state(wf.status());
            let published = wf
                .search_attributes()
                .get(&crate::workflows::RUN_STATE_ATTR)
                .and_then(|s| RunState::from_str_name(&s));
            match (state, published) {
                (RunState::Running, Some(live)) => state = live,
                // A completed run in which no fork succeeded.
                (RunState::Completed, Some(RunState::Failed)) => state = RunState::Failed,
                _ => {}
            }
            runs.push(RunSummary {
                run_id: wf.id().to_owned(),
                state: state as i32,
                started_unix_ms: unix_ms(wf.start_time()),
                finished_unix_ms: unix_ms(wf.close_time()),
            });
        }
        let next_page_token = if more {
            (offset + page_size).to_string()
        } else {
            String::new()
        };
        Ok(ListRunsResponse {
            runs,
            next_page_token,
        })
    }

    async fn live(&self, tenant: &Tenant, run_id: &str, action: &str) -> Result<(), GatewayError> {
        let (state, _, _) = self.describe(tenant, run_id).await?;
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

    fn fork_slot(run: &Run, fork: u32) -> Result<&ForkResult, GatewayError> {
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
        let amount = parse_usd(amount_usd).map_err(|e| GatewayError::field("amount_usd", e))?;
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
        self.describe(tenant, run_id).await?;
        let run = self.progress(run_id).await?;
        let slot = Self::fork_slot(&run, fork)?.clone();
        if slot.status == ForkStatus::Pending as i32
            && slot.sandbox_id.is_empty()
            && slot.started_unix_ms == 0
        {
            return Ok(slot);
        }
        let child = self
            .client
            .get_workflow_handle::<ForkWorkflow>(format!("{run_id}/fork-{fork}"));
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
            Ok(full) => Ok(full),
            Err(WorkflowGetResultError::NotFound(_)) => Ok(slot),
            // Terminated or failed children have no result: the run's copy says why.
            Err(_) => Ok(slot),
        }
    }
}
