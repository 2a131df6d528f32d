//! `forkyard.gateway.v1.Gateway`: the public API, mapped onto Temporal.
//!
//! A run is a `SandboxOrchestrationWorkflow` whose workflow id is the run id. Its
//! progress query is the single source of a run's fork states (it also answers after
//! the run closed), and Temporal's execution status is the run's state.

use crate::{
    error::GatewayError,
    validate::{self, Limits},
    workflows::{ORCHESTRATION_WORKFLOW, SandboxOrchestrationWorkflow},
};
use forkyard_proto::{
    gateway::v1::{
        CancelRunRequest, CancelRunResponse, GetRunRequest, LaunchRunRequest, LaunchRunResponse,
        ListRunsRequest, ListRunsResponse, Run, RunState, RunSummary, gateway_server::Gateway,
    },
    queues,
};
use futures::StreamExt;
use std::time::SystemTime;
use temporalio_client::{
    Client, WorkflowCancelOptions, WorkflowDescribeOptions, WorkflowExecutionStatus,
    WorkflowIdReusePolicy, WorkflowListOptions, WorkflowQueryOptions, WorkflowStartOptions,
    errors::WorkflowStartError,
};
use tonic::{Request, Response, Status};

pub struct GatewayService {
    client: Client,
    limits: Limits,
}

impl GatewayService {
    pub fn new(client: Client, limits: Limits) -> Self {
        Self { client, limits }
    }

    async fn state_of(&self, run_id: &str) -> Result<(RunState, i64, i64), GatewayError> {
        let handle = self
            .client
            .get_workflow_handle::<SandboxOrchestrationWorkflow>(run_id);
        let desc = handle
            .describe(WorkflowDescribeOptions::default())
            .await
            .map_err(|e| GatewayError::from_interaction(run_id, e))?;
        if desc.workflow_type() != ORCHESTRATION_WORKFLOW {
            return Err(GatewayError::RunNotFound(run_id.to_owned()));
        }
        Ok((
            run_state(desc.status()),
            unix_ms(desc.start_time()),
            unix_ms(desc.close_time()),
        ))
    }
}

fn unix_ms(t: Option<SystemTime>) -> i64 {
    t.and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_millis() as i64)
}

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

#[tonic::async_trait]
impl Gateway for GatewayService {
    async fn launch_run(
        &self,
        req: Request<LaunchRunRequest>,
    ) -> Result<Response<LaunchRunResponse>, Status> {
        let req = req.into_inner();
        let spec = validate::launch_spec(&req, &self.limits)?;
        let run_id = if req.request_id.is_empty() {
            format!("run-{}", uuid::Uuid::new_v4().simple())
        } else {
            validate::run_id_for(&req.request_id)?
        };
        validate::check_repo(&spec.repo).await?;

        // RejectDuplicate: a request id names one run forever, even after it closed.
        let opts = WorkflowStartOptions::new(queues::ORCHESTRATION, run_id.clone())
            .id_reuse_policy(WorkflowIdReusePolicy::RejectDuplicate)
            .build();
        let forks = spec.forks;
        match self
            .client
            .start_workflow(SandboxOrchestrationWorkflow::run, spec, opts)
            .await
        {
            Ok(_) => {
                tracing::info!(run_id, forks, "run launched");
                Ok(Response::new(LaunchRunResponse {
                    run_id,
                    created: true,
                }))
            }
            Err(WorkflowStartError::AlreadyStarted { .. }) => {
                tracing::info!(run_id, "launch replayed; run already exists");
                Ok(Response::new(LaunchRunResponse {
                    run_id,
                    created: false,
                }))
            }
            Err(e) => Err(GatewayError::from_start(e).into()),
        }
    }

    async fn get_run(&self, req: Request<GetRunRequest>) -> Result<Response<Run>, Status> {
        let req = req.into_inner();
        validate::check_run_id(&req.run_id)?;
        let (state, started, finished) = self.state_of(&req.run_id).await?;
        let handle = self
            .client
            .get_workflow_handle::<SandboxOrchestrationWorkflow>(&req.run_id);
        let mut run = handle
            .query(
                SandboxOrchestrationWorkflow::progress,
                (),
                WorkflowQueryOptions::default(),
            )
            .await
            .map_err(|e| GatewayError::from_query(&req.run_id, e))?;
        run.run_id = req.run_id;
        run.state = state as i32;
        if run.started_unix_ms == 0 {
            run.started_unix_ms = started;
        }
        if run.finished_unix_ms == 0 {
            run.finished_unix_ms = finished;
        }
        if !req.include_patches {
            for f in &mut run.forks {
                f.patch.clear();
            }
        }
        Ok(Response::new(run))
    }

    async fn list_runs(
        &self,
        req: Request<ListRunsRequest>,
    ) -> Result<Response<ListRunsResponse>, Status> {
        let req = req.into_inner();
        let page_size = match req.page_size {
            0 => 50,
            n if n > 1000 => return Err(GatewayError::field("page_size", "at most 1000").into()),
            n => n as usize,
        };
        let offset: usize = if req.page_token.is_empty() {
            0
        } else {
            req.page_token
                .parse()
                .map_err(|_| GatewayError::field("page_token", "is not a token from ListRuns"))?
        };
        let query = format!("WorkflowType = '{ORCHESTRATION_WORKFLOW}'");
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
            runs.push(RunSummary {
                run_id: wf.id().to_owned(),
                state: run_state(wf.status()) as i32,
                started_unix_ms: unix_ms(wf.start_time()),
                finished_unix_ms: unix_ms(wf.close_time()),
            });
        }
        let next_page_token = if more {
            (offset + page_size).to_string()
        } else {
            String::new()
        };
        Ok(Response::new(ListRunsResponse {
            runs,
            next_page_token,
        }))
    }

    async fn cancel_run(
        &self,
        req: Request<CancelRunRequest>,
    ) -> Result<Response<CancelRunResponse>, Status> {
        let req = req.into_inner();
        validate::check_run_id(&req.run_id)?;
        let (state, _, _) = self.state_of(&req.run_id).await?;
        if state != RunState::Running {
            return Err(GatewayError::FailedPrecondition(format!(
                "run {} already finished ({})",
                req.run_id,
                state.as_str_name()
            ))
            .into());
        }
        let reason = if req.reason.is_empty() {
            "cancelled through the gateway".to_owned()
        } else {
            req.reason
        };
        let handle = self
            .client
            .get_workflow_handle::<SandboxOrchestrationWorkflow>(&req.run_id);
        handle
            .cancel(WorkflowCancelOptions::builder().reason(reason).build())
            .await
            .map_err(|e| GatewayError::from_interaction(&req.run_id, e))?;
        tracing::info!(run_id = %req.run_id, "run cancel requested");
        Ok(Response::new(CancelRunResponse {}))
    }
}
