//! `forkyard.agent.v1.AgentRunner` over gRPC, and the provisioner clients it uses.

use crate::{command, error::AgentError};
use forkyard_proto::{
    agent::v1::{
        ListDriversRequest, ListDriversResponse, RunAgentRequest, RunAgentResponse,
        agent_runner_server::AgentRunner,
    },
    sandbox::v1::sandbox_provisioner_client::SandboxProvisionerClient,
};
use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::Duration,
};
use tonic::{
    Request, Response, Status,
    transport::{Channel, Endpoint},
};

/// One lazily-connected channel per provisioner replica; a sandbox's commands go to the
/// replica that owns it (`sandbox_endpoint`), else to the configured default.
#[derive(Clone)]
pub struct Provisioners {
    default_endpoint: String,
    channels: Arc<Mutex<HashMap<String, Channel>>>,
}

impl Provisioners {
    pub fn new(default_endpoint: String) -> Self {
        Self {
            default_endpoint,
            channels: Arc::default(),
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
        let mut channels = self
            .channels
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let channel = match channels.get(&endpoint) {
            Some(c) => c.clone(),
            None => {
                let c = Endpoint::from_shared(endpoint.clone())
                    .map_err(|e| {
                        AgentError::InvalidArgument(format!("sandbox_endpoint: {endpoint:?}: {e}"))
                    })?
                    .connect_timeout(Duration::from_secs(5))
                    .connect_lazy();
                channels.insert(endpoint.clone(), c.clone());
                c
            }
        };
        let client = SandboxProvisionerClient::new(channel).max_decoding_message_size(64 << 20);
        Ok((client, endpoint))
    }
}

pub struct AgentRunnerService {
    pub provisioners: Provisioners,
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
        let (client, endpoint) = self.provisioners.client_for(&req.sandbox_endpoint)?;
        let out = command::run(
            client,
            &endpoint,
            &req,
            &command::NoProgress,
            Duration::from_secs(3600),
            std::future::pending(),
        )
        .await?;
        Ok(Response::new(out))
    }

    async fn list_drivers(
        &self,
        _: Request<ListDriversRequest>,
    ) -> Result<Response<ListDriversResponse>, Status> {
        Ok(Response::new(ListDriversResponse {
            drivers: command::DRIVERS.iter().map(|d| (*d).to_owned()).collect(),
        }))
    }
}
