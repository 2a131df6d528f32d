//! One entry point for both the activity and the gRPC method: route a request to its
//! driver with the sandbox, ledger and artifact store it needs.

use crate::{
    agent_loop::{self, Env},
    charge::Charger,
    command,
    drivers::Drivers,
    error::AgentError,
    llm_gateway::LlmGateway,
    presets,
    progress::ProgressSink,
    provisioners::Provisioners,
    tools::Sandbox,
    transcript::ArtifactStore,
};
use forkyard_common::balance::Balanced;
use forkyard_proto::{
    agent::v1::{AgentProgress, RunAgentRequest, RunAgentResponse},
    budget::v1::budget_ledger_client::BudgetLedgerClient,
};
use std::{future::Future, sync::Arc, time::Duration};

#[derive(Clone)]
pub struct Runner {
    pub provisioners: Provisioners,
    /// Lazily connected; only LLM drivers with a reservation use it.
    pub ledger: Balanced,
    pub drivers: Arc<Drivers>,
    pub store: Option<ArtifactStore>,
    pub heartbeat: Duration,
    /// This replica's gRPC endpoint as others reach it (`--advertise-addr`), returned as
    /// `transcript_endpoint` so GetForkResult asks the replica holding the transcript.
    pub advertise: String,
    /// The metering LLM gateway every command-like agent reaches its model through;
    /// `None` (`--llm-listen ''`): no model access from sandboxes but what stdout meters.
    pub llm_gateway: Option<Arc<LlmGateway>>,
}

/// A channel over every replica of `addr` (`flag` names the setting in errors), for
/// short calls.
pub fn short_call_channel(flag: &str, addr: &str) -> Result<Balanced, String> {
    forkyard_common::discovery::balanced(flag, addr, |ep| {
        ep.connect_timeout(Duration::from_secs(5))
            .timeout(forkyard_common::tls::SHORT_CALL_DEADLINE)
    })
}

impl Runner {
    /// Whether this runner can run `agent` (asked at launch): the driver and model id.
    pub fn check(
        &self,
        agent: &forkyard_proto::common::v1::AgentSpec,
    ) -> Result<crate::drivers::Choice, AgentError> {
        if !presets::is_command_like(&agent.driver) {
            return self.drivers.check(agent);
        }
        let probe = RunAgentRequest {
            sandbox_id: "check".into(),
            agent: Some(agent.clone()),
            ..Default::default()
        };
        let program = presets::program(&probe, &self.drivers.models, self.drivers.max_turns)?;
        self.gateway_for(&agent.driver)?;
        for m in &agent.allowed_models {
            if m.trim().is_empty() {
                return Err(AgentError::InvalidArgument(
                    "agent.allowed_models: holds an empty name".into(),
                ));
            }
        }
        Ok(crate::drivers::Choice {
            driver: if agent.driver.is_empty() {
                "command".into()
            } else {
                agent.driver.clone()
            },
            model: program.model,
        })
    }

    /// The presets talk to a model only through this runner's LLM gateway.
    fn gateway_for(&self, driver: &str) -> Result<(), AgentError> {
        if matches!(driver, "" | "command") || self.llm_gateway.is_some() {
            return Ok(());
        }
        Err(AgentError::InvalidArgument(format!(
            "agent.driver: {driver} needs this runner's LLM gateway, which is off (--llm-listen)"
        )))
    }

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
        let is_command = presets::is_command_like(driver);
        let program = if is_command {
            Some(presets::program(
                req,
                &self.drivers.models,
                self.drivers.max_turns,
            )?)
        } else {
            None
        };
        if is_command {
            self.gateway_for(driver)?;
        }
        let choice = match &program {
            Some(p) => crate::drivers::Choice {
                driver: if driver.is_empty() {
                    "command".into()
                } else {
                    driver.into()
                },
                model: p.model.clone(),
            },
            None => self
                .drivers
                .check(req.agent.as_ref().unwrap_or(&Default::default()))?,
        };
        let charger = (!req.reservation_id.is_empty()).then(|| Charger {
            client: BudgetLedgerClient::new(forkyard_common::grpc_telemetry::traced_channel(
                self.ledger.clone(),
            )),
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
        if let Some(program) = program {
            let agent = req.agent.clone().unwrap_or_default();
            let llm = self.llm_gateway.as_ref().map(|g| {
                (
                    g,
                    presets::allowed(&agent, &program.model, &self.drivers.models),
                )
            });
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
                program,
                llm,
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
