//! `forkyard.agent.v1.AgentRunner` over gRPC.

use crate::{error::AgentError, progress::NoProgress, runner::Runner};
use forkyard_proto::agent::v1::{
    CaptureBranchPointRequest, CaptureBranchPointResponse, CheckDriverRequest, CheckDriverResponse,
    GetTranscriptRequest, GetTranscriptResponse, ListDriversRequest, ListDriversResponse,
    RunAgentRequest, RunAgentResponse, agent_runner_server::AgentRunner,
};
use tonic::{Request, Response, Status};

pub struct AgentRunnerService {
    pub runner: Runner,
}

#[tonic::async_trait]
impl AgentRunner for AgentRunnerService {
    /// Runs the agent for an operator; the call lasts as long as the agent, and
    /// cancelling the call kills it.
    async fn run_agent(
        &self,
        req: Request<RunAgentRequest>,
    ) -> Result<Response<RunAgentResponse>, Status> {
        let req = req.into_inner();
        let out = self
            .runner
            .run(&req, &NoProgress, std::future::pending(), None, 1)
            .await?;
        Ok(Response::new(out))
    }

    async fn list_drivers(
        &self,
        _: Request<ListDriversRequest>,
    ) -> Result<Response<ListDriversResponse>, Status> {
        Ok(Response::new(ListDriversResponse {
            drivers: forkyard_proto::Driver::ALL
                .map(|d| d.name().to_owned())
                .into(),
            model_aliases: self
                .runner
                .drivers
                .models
                .aliases
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        }))
    }

    async fn check_driver(
        &self,
        req: Request<CheckDriverRequest>,
    ) -> Result<Response<CheckDriverResponse>, Status> {
        let agent = req.into_inner().agent.unwrap_or_default();
        let choice = self.runner.check(&agent)?;
        Ok(Response::new(CheckDriverResponse {
            driver: choice.driver,
            model: choice.model,
        }))
    }

    async fn get_transcript(
        &self,
        req: Request<GetTranscriptRequest>,
    ) -> Result<Response<GetTranscriptResponse>, Status> {
        let req = req.into_inner();
        if req.run_id.is_empty() {
            return Err(AgentError::InvalidArgument("run_id: is empty".into()).into());
        }
        let found = self
            .runner
            .store
            .as_ref()
            .and_then(|s| s.get(&req.run_id, req.fork, req.attempt));
        let Some((attempt, jsonl, truncated)) = found else {
            return Err(Status::not_found(format!(
                "no transcript for fork {} of {} on this runner",
                req.fork, req.run_id
            )));
        };
        Ok(Response::new(GetTranscriptResponse {
            jsonl,
            attempt,
            truncated,
        }))
    }

    async fn capture_branch_point(
        &self,
        req: Request<CaptureBranchPointRequest>,
    ) -> Result<Response<CaptureBranchPointResponse>, Status> {
        let point = crate::branch_point::capture(&self.runner, &req.into_inner()).await?;
        Ok(Response::new(point))
    }
}
