//! `forkyard.agent.v1.AgentRunner` over gRPC, and the provisioner clients it uses.

use crate::{command, drivers::DRIVERS, error::AgentError, runner::Runner};
use forkyard_proto::{
    agent::v1::{
        CheckDriverRequest, CheckDriverResponse, GetTranscriptRequest, GetTranscriptResponse,
        ListDriversRequest, ListDriversResponse, RunAgentRequest, RunAgentResponse,
        agent_runner_server::AgentRunner,
    },
    sandbox::v1::sandbox_provisioner_client::SandboxProvisionerClient,
};
use std::time::Duration;
use tonic::{Request, Response, Status};
// Traced: calls are spans of the agent's activity span and carry the trace onward.
use forkyard_common::{
    grpc_telemetry::{TracedChannel as Channel, traced_channel},
    pool::ChannelPool,
};

/// One lazily-connected channel per provisioner replica; a sandbox's commands go to the
/// replica that owns it (`sandbox_endpoint`), else to the configured default.
#[derive(Clone)]
pub struct Provisioners {
    default_endpoint: String,
    channels: ChannelPool,
}

impl Provisioners {
    pub fn new(default_endpoint: String) -> Self {
        Self {
            default_endpoint,
            channels: ChannelPool::new(1024),
        }
    }

    pub fn client_for(
        &self,
        endpoint: &str,
    ) -> Result<(SandboxProvisionerClient<Channel>, String), AgentError> {
        let endpoint = if endpoint.is_empty() {
            self.default_endpoint.clone()
        } else {
            endpoint.to_owned()
        };
        let channel = self.channels.get_or(&endpoint, || {
            let c = forkyard_common::tls::endpoint(&endpoint)
                .map_err(|e| {
                    AgentError::InvalidArgument(format!("sandbox_endpoint: {endpoint:?}: {e}"))
                })?
                .connect_timeout(Duration::from_secs(5))
                .connect_lazy();
            Ok::<_, AgentError>(traced_channel(c))
        })?;
        let client = SandboxProvisionerClient::new(channel).max_decoding_message_size(64 << 20);
        Ok((client, endpoint))
    }
}

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
            .run(&req, &command::NoProgress, std::future::pending(), None, 1)
            .await?;
        Ok(Response::new(out))
    }

    async fn list_drivers(
        &self,
        _: Request<ListDriversRequest>,
    ) -> Result<Response<ListDriversResponse>, Status> {
        Ok(Response::new(ListDriversResponse {
            drivers: DRIVERS.iter().map(|d| (*d).to_owned()).collect(),
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
}
