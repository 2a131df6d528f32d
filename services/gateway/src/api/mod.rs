//! `forkyard.gateway.v1.Gateway`: the public API, mapped onto Temporal.
//!
//! A run is a `SandboxOrchestrationWorkflow` whose workflow id is the run id; fork n is
//! its child `<run id>/fork-<n>`. The run's `progress` query is the source of fork
//! states (it also answers after the run closed); Temporal's execution status is the
//! run's state once it closed.

mod agent_runner;
mod branch;
mod branch_point;
pub mod cleanup;
mod forks;
mod keys;
mod launch;
mod list;
mod publish;
mod run_reads;
mod run_state;
mod runs;
mod steer;
mod tenancy;
mod watch;

use crate::{auth::Tenant, error::GatewayError, validate::Limits};
use forkyard_proto::{
    common::v1::{ForkResult, ForkStatus},
    gateway::v1::{
        BranchForkRequest, BranchForkResponse, CancelForkRequest, CancelForkResponse,
        CancelRunRequest, CancelRunResponse, GetForkResultRequest, GetRunRequest, LaunchRunRequest,
        LaunchRunResponse, ListRunsRequest, ListRunsResponse, PauseRunRequest, PublishForkRequest,
        RaiseBudgetRequest, RaiseBudgetResponse, ResumeRunRequest, Run, RunEvent,
        StartCleanupRequest, StartCleanupResponse, StopCleanupRequest, StopCleanupResponse,
        WatchRunRequest, gateway_server::Gateway,
    },
};
use std::{pin::Pin, time::Duration};
use temporalio_client::Client;
use tonic::{Request, Response, Status};

pub use crate::tenant_policy::TenantPolicy;
pub use run_reads::ReadLimits;
pub use run_state::run_state;

#[derive(Clone)]
pub struct GatewayService {
    client: Client,
    limits: Limits,
    /// How often WatchRun looks at the run.
    watch_interval: Duration,
    /// Asked at launch whether it can run the agent spec, and for transcripts.
    agent_runner: Option<AgentRunnerLink>,
    tenancy: TenantPolicy,
    /// Longest a call may take, its calls to Temporal and the ledger included.
    deadline: Duration,
    /// Run views kept and shared between readers (`run_reads`).
    reads: run_reads::RunReads,
}

pub use agent_runner::AgentRunnerLink;
pub use keys::ApiKeysService;

impl GatewayService {
    /// Check LLM agent specs with, and fetch transcripts from, this agent runner.
    pub fn with_agent_runner(mut self, link: AgentRunnerLink) -> Self {
        self.agent_runner = Some(link);
        self
    }

    pub fn new(client: Client, limits: Limits) -> Self {
        Self {
            client,
            limits,
            watch_interval: Duration::from_millis(500),
            agent_runner: None,
            tenancy: TenantPolicy::default(),
            deadline: Duration::from_secs(30),
            reads: run_reads::RunReads::new(ReadLimits::default()),
        }
    }

    pub fn with_read_limits(mut self, limits: ReadLimits) -> Self {
        self.reads = run_reads::RunReads::new(limits);
        self
    }

    pub fn with_tenancy(mut self, tenancy: TenantPolicy) -> Self {
        self.tenancy = tenancy;
        self
    }

    pub fn with_deadline(mut self, deadline: Duration) -> Self {
        self.deadline = deadline;
        self
    }

    /// `fut` within the call deadline: DEADLINE_EXCEEDED rather than a caller left hanging
    /// on a slow Temporal or ledger.
    async fn bounded<T>(
        &self,
        fut: impl Future<Output = std::result::Result<T, GatewayError>>,
    ) -> std::result::Result<T, GatewayError> {
        tokio::time::timeout(self.deadline, fut)
            .await
            .unwrap_or_else(|_| {
                Err(GatewayError::DeadlineExceeded(format!(
                    "the call took longer than {:?}",
                    self.deadline
                )))
            })
    }
}

/// The caller the gate admitted. Without the gate nobody is admitted (fail closed).
fn tenant<T>(req: &Request<T>) -> std::result::Result<Tenant, Status> {
    req.extensions().get::<Tenant>().cloned().ok_or_else(|| {
        Status::unauthenticated("no caller identity (gateway built without its gate)")
    })
}

type Result<T> = std::result::Result<Response<T>, Status>;

fn ok<T>(r: std::result::Result<T, GatewayError>) -> Result<T> {
    r.map(Response::new).map_err(Status::from)
}

#[tonic::async_trait]
impl Gateway for GatewayService {
    async fn launch_run(&self, req: Request<LaunchRunRequest>) -> Result<LaunchRunResponse> {
        let t = tenant(&req)?;
        ok(self.bounded(self.launch(&t, req.into_inner())).await)
    }

    async fn get_run(&self, req: Request<GetRunRequest>) -> Result<Run> {
        let t = tenant(&req)?;
        ok(self.bounded(self.run(&t, &req.into_inner().run_id)).await)
    }

    type WatchRunStream =
        Pin<Box<dyn futures::Stream<Item = std::result::Result<RunEvent, Status>> + Send>>;

    async fn watch_run(&self, req: Request<WatchRunRequest>) -> Result<Self::WatchRunStream> {
        let t = tenant(&req)?;
        // The stream runs as long as the run; only setting it up is bounded.
        ok(self.bounded(self.watch(t, req.into_inner().run_id)).await)
    }

    async fn list_runs(&self, req: Request<ListRunsRequest>) -> Result<ListRunsResponse> {
        let t = tenant(&req)?;
        ok(self.bounded(self.list(&t, req.into_inner())).await)
    }

    async fn pause_run(&self, req: Request<PauseRunRequest>) -> Result<Run> {
        let t = tenant(&req)?;
        ok(self
            .bounded(self.set_paused(&t, &req.into_inner().run_id, true))
            .await)
    }

    async fn resume_run(&self, req: Request<ResumeRunRequest>) -> Result<Run> {
        let t = tenant(&req)?;
        ok(self
            .bounded(self.set_paused(&t, &req.into_inner().run_id, false))
            .await)
    }

    async fn cancel_run(&self, req: Request<CancelRunRequest>) -> Result<CancelRunResponse> {
        let t = tenant(&req)?;
        let req = req.into_inner();
        ok(self
            .bounded(self.cancel(&t, &req.run_id, req.reason))
            .await
            .map(|()| CancelRunResponse {}))
    }

    async fn cancel_fork(&self, req: Request<CancelForkRequest>) -> Result<CancelForkResponse> {
        let t = tenant(&req)?;
        let req = req.into_inner();
        ok(self
            .bounded(self.cancel_one_fork(&t, &req.run_id, req.fork))
            .await
            .map(|()| CancelForkResponse {}))
    }

    async fn raise_budget(&self, req: Request<RaiseBudgetRequest>) -> Result<RaiseBudgetResponse> {
        let t = tenant(&req)?;
        let req = req.into_inner();
        ok(self
            .bounded(self.raise(&t, &req.run_id, &req.amount_usd))
            .await)
    }

    async fn get_fork_result(&self, req: Request<GetForkResultRequest>) -> Result<ForkResult> {
        let t = tenant(&req)?;
        let req = req.into_inner();
        let mut out = ok(self
            .bounded(self.fork_result(&t, &req.run_id, req.fork))
            .await)?;
        self.attach_transcript(&req.run_id, out.get_mut()).await;
        let f = out.get_mut();
        if f.delivered.is_none() && f.status == ForkStatus::Succeeded as i32 {
            f.delivered = self.published(&req.run_id, req.fork).await;
        }
        Ok(out)
    }

    async fn publish_fork(&self, req: Request<PublishForkRequest>) -> Result<ForkResult> {
        let t = tenant(&req)?;
        let req = req.into_inner();
        // Not bounded by the read deadline: a push and a pull request take their time.
        ok(self.publish(&t, req).await)
    }

    async fn branch_fork(&self, req: Request<BranchForkRequest>) -> Result<BranchForkResponse> {
        let t = tenant(&req)?;
        ok(self.bounded(self.branch(&t, req.into_inner())).await)
    }

    async fn start_cleanup(
        &self,
        req: Request<StartCleanupRequest>,
    ) -> Result<StartCleanupResponse> {
        admin(&tenant(&req)?)?;
        ok(self.bounded(self.schedule_cleanup(req.into_inner())).await)
    }

    async fn stop_cleanup(&self, req: Request<StopCleanupRequest>) -> Result<StopCleanupResponse> {
        admin(&tenant(&req)?)?;
        ok(self
            .bounded(self.unschedule_cleanup())
            .await
            .map(|()| StopCleanupResponse {}))
    }
}

/// The janitor's schedule is the operators', not a tenant's (`--admin-tenants`).
fn admin(t: &Tenant) -> std::result::Result<(), Status> {
    if t.admin {
        Ok(())
    } else {
        Err(Status::permission_denied(format!(
            "tenant {} may not manage the cleanup schedule (not in --admin-tenants)",
            t.name
        )))
    }
}
