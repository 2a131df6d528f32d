//! `forkyard.gateway.v1.Gateway`: the public API, mapped onto Temporal.
//!
//! A run is a `SandboxOrchestrationWorkflow` whose workflow id is the run id; fork n is
//! its child `<run id>/fork-<n>`. The run's `progress` query is the source of fork
//! states (it also answers after the run closed); Temporal's execution status is the
//! run's state once it closed.

mod cleanup;
mod runs;
mod watch;

use crate::{error::GatewayError, validate::Limits};
use forkyard_proto::{
    common::v1::ForkResult,
    gateway::v1::{
        CancelForkRequest, CancelForkResponse, CancelRunRequest, CancelRunResponse,
        GetForkResultRequest, GetRunRequest, LaunchRunRequest, LaunchRunResponse, ListRunsRequest,
        ListRunsResponse, PauseRunRequest, RaiseBudgetRequest, RaiseBudgetResponse,
        ResumeRunRequest, Run, RunEvent, StartCleanupRequest, StartCleanupResponse,
        StopCleanupRequest, StopCleanupResponse, WatchRunRequest, gateway_server::Gateway,
    },
};
use std::{pin::Pin, time::Duration};
use temporalio_client::Client;
use tonic::{Request, Response, Status};

pub use runs::run_state;

#[derive(Clone)]
pub struct GatewayService {
    client: Client,
    limits: Limits,
    /// How often WatchRun looks at the run.
    watch_interval: Duration,
}

impl GatewayService {
    pub fn new(client: Client, limits: Limits) -> Self {
        Self {
            client,
            limits,
            watch_interval: Duration::from_millis(500),
        }
    }
}

type Result<T> = std::result::Result<Response<T>, Status>;

fn ok<T>(r: std::result::Result<T, GatewayError>) -> Result<T> {
    r.map(Response::new).map_err(Status::from)
}

#[tonic::async_trait]
impl Gateway for GatewayService {
    async fn launch_run(&self, req: Request<LaunchRunRequest>) -> Result<LaunchRunResponse> {
        ok(self.launch(req.into_inner()).await)
    }

    async fn get_run(&self, req: Request<GetRunRequest>) -> Result<Run> {
        ok(self.run(&req.into_inner().run_id).await)
    }

    type WatchRunStream =
        Pin<Box<dyn futures::Stream<Item = std::result::Result<RunEvent, Status>> + Send>>;

    async fn watch_run(&self, req: Request<WatchRunRequest>) -> Result<Self::WatchRunStream> {
        ok(self.watch(req.into_inner().run_id).await)
    }

    async fn list_runs(&self, req: Request<ListRunsRequest>) -> Result<ListRunsResponse> {
        ok(self.list(req.into_inner()).await)
    }

    async fn pause_run(&self, req: Request<PauseRunRequest>) -> Result<Run> {
        ok(self.set_paused(&req.into_inner().run_id, true).await)
    }

    async fn resume_run(&self, req: Request<ResumeRunRequest>) -> Result<Run> {
        ok(self.set_paused(&req.into_inner().run_id, false).await)
    }

    async fn cancel_run(&self, req: Request<CancelRunRequest>) -> Result<CancelRunResponse> {
        let req = req.into_inner();
        ok(self
            .cancel(&req.run_id, req.reason)
            .await
            .map(|()| CancelRunResponse {}))
    }

    async fn cancel_fork(&self, req: Request<CancelForkRequest>) -> Result<CancelForkResponse> {
        let req = req.into_inner();
        ok(self
            .cancel_one_fork(&req.run_id, req.fork)
            .await
            .map(|()| CancelForkResponse {}))
    }

    async fn raise_budget(&self, req: Request<RaiseBudgetRequest>) -> Result<RaiseBudgetResponse> {
        let req = req.into_inner();
        ok(self.raise(&req.run_id, &req.amount_usd).await)
    }

    async fn get_fork_result(&self, req: Request<GetForkResultRequest>) -> Result<ForkResult> {
        let req = req.into_inner();
        ok(self.fork_result(&req.run_id, req.fork).await)
    }

    async fn start_cleanup(
        &self,
        req: Request<StartCleanupRequest>,
    ) -> Result<StartCleanupResponse> {
        ok(self.schedule_cleanup(req.into_inner()).await)
    }

    async fn stop_cleanup(&self, _req: Request<StopCleanupRequest>) -> Result<StopCleanupResponse> {
        ok(self
            .unschedule_cleanup()
            .await
            .map(|()| StopCleanupResponse {}))
    }
}
