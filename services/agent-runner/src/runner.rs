//! One entry point for both the activity and the gRPC method: route a request to its
//! driver with the sandbox, ledger and artifact store it needs.

use crate::{
    agent_loop::{self, Env},
    charge::Charger,
    command::{self, ProgressSink},
    drivers::Drivers,
    error::AgentError,
    grpc::Provisioners,
    tools::Sandbox,
    transcript::ArtifactStore,
};
use forkyard_proto::{
    agent::v1::{AgentProgress, RunAgentRequest, RunAgentResponse},
    budget::v1::budget_ledger_client::BudgetLedgerClient,
};
use std::{future::Future, sync::Arc, time::Duration};
use tonic::transport::Channel;

#[derive(Clone)]
pub struct Runner {
    pub provisioners: Provisioners,
    /// Lazily connected; only LLM drivers with a reservation use it.
    pub ledger: Channel,
    pub drivers: Arc<Drivers>,
    pub store: Option<ArtifactStore>,
    pub heartbeat: Duration,
    /// This replica's gRPC endpoint as others reach it (`--advertise-addr`), returned as
    /// `transcript_endpoint` so GetForkResult asks the replica holding the transcript.
    pub advertise: String,
}

/// A lazily connected channel to `addr` (checked to be a URL by the caller).
pub fn lazy_channel(addr: &str) -> Result<Channel, String> {
    Ok(forkyard_common::tls::short_call_endpoint(addr)
        .map_err(|e| format!("{addr:?} is not a URL: {e}"))?
        .connect_timeout(Duration::from_secs(5))
        .connect_lazy())
}

impl Runner {
    /// Run the agent `req` asks for. `resume` is the last heartbeat of a failed attempt
    /// of the same activity (`activity_attempt` > 1).
    pub async fn run(
        &self,
        req: &RunAgentRequest,
        sink: &(impl ProgressSink + Sync),
        cancelled: impl Future<Output = ()> + Send,
        resume: Option<AgentProgress>,
        activity_attempt: u32,
    ) -> Result<RunAgentResponse, AgentError> {
        let mut out = self
            .run_driver(req, sink, cancelled, resume, activity_attempt)
            .await?;
        if !out.transcript_key.is_empty() {
            out.transcript_endpoint.clone_from(&self.advertise);
        }
        Ok(out)
    }

    async fn run_driver(
        &self,
        req: &RunAgentRequest,
        sink: &(impl ProgressSink + Sync),
        cancelled: impl Future<Output = ()> + Send,
        resume: Option<AgentProgress>,
        activity_attempt: u32,
    ) -> Result<RunAgentResponse, AgentError> {
        let (client, endpoint) = self.provisioners.client_for(&req.sandbox_endpoint)?;
        let driver = req.agent.as_ref().map_or("", |a| a.driver.as_str());
        let is_command = driver.is_empty() || driver == "command";
        let choice = if is_command {
            command::validate(req)?;
            crate::drivers::Choice {
                driver: "command".into(),
                model: req
                    .agent
                    .as_ref()
                    .map_or(String::new(), |a| a.model.clone()),
            }
        } else {
            self.drivers
                .check(req.agent.as_ref().unwrap_or(&Default::default()))?
        };
        let charger = (!req.reservation_id.is_empty()).then(|| Charger {
            client: BudgetLedgerClient::new(self.ledger.clone()),
            reservation_id: req.reservation_id.clone(),
            key_prefix: if req.charge_key.is_empty() {
                format!("agent/{}/{}/{}", req.run_id, req.fork, req.attempt.max(1))
            } else {
                req.charge_key.clone()
            },
            run_id: req.run_id.clone(),
            fork: req.fork,
            model: choice.model.clone(),
            activity_attempt,
        });
        if is_command {
            let env = command::Env {
                client,
                endpoint,
                sink,
                heartbeat: self.heartbeat,
                cancelled: Box::pin(cancelled),
                models: &self.drivers.models,
                charger,
                store: self.store.as_ref(),
                resume,
                activity_attempt,
            };
            return command::run(req, env).await;
        }
        let env = Env {
            drivers: &self.drivers,
            sandbox: Sandbox {
                client,
                endpoint,
                sandbox_id: req.sandbox_id.clone(),
            },
            charger,
            store: self.store.as_ref(),
            sink,
            heartbeat: self.heartbeat,
            cancelled: Box::pin(cancelled),
            resume,
            activity_attempt,
        };
        agent_loop::run(req, env).await
    }
}
