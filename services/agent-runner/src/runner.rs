//! One entry point for both the activity and the gRPC method: route a request to its
//! driver with the sandbox, ledger and artifact store it needs.

use crate::{
    agent_loop,
    charge::Charger,
    command,
    drivers::{Choice, Drivers},
    error::AgentError,
    llm_gateway::{
        LlmGateway,
        capture::{Captures, Snapshotter},
    },
    presets::{self, Program},
    progress::ProgressSink,
    provisioners::Provisioners,
    tools::Sandbox,
    transcript::ArtifactStore,
};
use forkyard_common::{balance::Balanced, grpc_telemetry::TracedChannel as Channel};
use forkyard_proto::{
    agent::v1::{AgentProgress, RunAgentRequest, RunAgentResponse},
    budget::v1::budget_ledger_client::BudgetLedgerClient,
    sandbox::v1::sandbox_provisioner_client::SandboxProvisionerClient,
};
use std::{collections::HashMap, future::Future, pin::Pin, sync::Arc, time::Duration};

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
    /// The built-in loops running here, where their branch points are asked.
    pub loops: Arc<crate::loops::Loops>,
}

/// A channel over every replica of `addr` (`flag` names the setting in errors), for
/// short calls.
pub fn short_call_channel(flag: &str, addr: &str) -> Result<Balanced, String> {
    forkyard_common::discovery::balanced(flag, addr, |ep| {
        ep.connect_timeout(Duration::from_secs(5))
            .timeout(forkyard_common::tls::SHORT_CALL_DEADLINE)
    })
}

/// What a driver gets from the caller of [`Runner::run`] besides the request.
struct Caller<'a, S: ProgressSink> {
    sink: &'a S,
    cancelled: Pin<Box<dyn Future<Output = ()> + Send + 'a>>,
    resume: Option<AgentProgress>,
    activity_attempt: u32,
}

/// A command-like driver's choice: the driver by name, the model its program uses.
fn command_choice(driver: &str, program: &Program) -> Choice {
    Choice {
        driver: if driver.is_empty() {
            "command".into()
        } else {
            driver.into()
        },
        model: program.model.clone(),
    }
}

impl Runner {
    /// Whether this runner can run `agent` (asked at launch): the driver and model id.
    pub fn check(
        &self,
        agent: &forkyard_proto::common::v1::AgentSpec,
    ) -> Result<Choice, AgentError> {
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
        Ok(command_choice(&agent.driver, &program))
    }

    /// The presets talk to a model only through this runner's LLM gateway.
    fn gateway_for(&self, driver: &str) -> Result<(), AgentError> {
        let needs = forkyard_proto::Driver::parse(driver)
            .is_some_and(|d| d.capabilities().needs_llm_gateway);
        if !needs || self.llm_gateway.is_some() {
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
        let caller = Caller {
            sink,
            cancelled: Box::pin(cancelled),
            resume,
            activity_attempt,
        };
        let mut out = self.run_driver(req, caller).await?;
        if !out.transcript_key.is_empty() {
            out.transcript_endpoint.clone_from(&self.advertise);
        }
        Ok(out)
    }

    /// Route `req` to its driver: a command-like one runs its program in the sandbox, an
    /// LLM one the tool-use loop.
    async fn run_driver<S: ProgressSink + Sync>(
        &self,
        req: &RunAgentRequest,
        caller: Caller<'_, S>,
    ) -> Result<RunAgentResponse, AgentError> {
        let sandbox = self.provisioners.client_for(&req.sandbox_endpoint)?;
        let program = self.program_for(req)?;
        let choice = match &program {
            Some(p) => command_choice(req.agent.as_ref().map_or("", |a| a.driver.as_str()), p),
            None => self
                .drivers
                .check(req.agent.as_ref().unwrap_or(&Default::default()))?,
        };
        let charger = self.charger(req, choice.model, caller.activity_attempt);
        match program {
            Some(program) => {
                let env = self.command_env(req, program, sandbox, charger, caller);
                command::run(req, env).await
            }
            None => agent_loop::run(req, self.loop_env(req, sandbox, charger, caller)).await,
        }
    }

    /// The program of a command-like driver (none for the LLM drivers); INVALID_ARGUMENT
    /// when it cannot be made or needs the gateway this runner lacks.
    fn program_for(&self, req: &RunAgentRequest) -> Result<Option<Program>, AgentError> {
        let driver = req.agent.as_ref().map_or("", |a| a.driver.as_str());
        if !presets::is_command_like(driver) {
            return Ok(None);
        }
        let program = presets::program(req, &self.drivers.models, self.drivers.max_turns)?;
        self.gateway_for(driver)?;
        Ok(Some(program))
    }

    /// What charges the fork's reservation for `model`'s use; none without one.
    fn charger(
        &self,
        req: &RunAgentRequest,
        model: String,
        activity_attempt: u32,
    ) -> Option<Charger> {
        (!req.reservation_id.is_empty()).then(|| Charger {
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
            model,
            activity_attempt,
        })
    }

    /// What the command driver gets to run `program` in the sandbox (`client`, `endpoint`).
    fn command_env<'a, S: ProgressSink>(
        &'a self,
        req: &RunAgentRequest,
        program: Program,
        (client, endpoint): (SandboxProvisionerClient<Channel>, String),
        charger: Option<Charger>,
        caller: Caller<'a, S>,
    ) -> command::Env<'a, S> {
        let agent = req.agent.clone().unwrap_or_default();
        let llm = self.llm_gateway.as_ref().map(|g| {
            (
                g,
                presets::allowed(&agent, &program.model, &self.drivers.models),
            )
        });
        command::Env {
            client,
            endpoint,
            sink: caller.sink,
            heartbeat: self.heartbeat,
            cancelled: caller.cancelled,
            models: &self.drivers.models,
            charger,
            store: self.store.as_ref(),
            resume: caller.resume,
            activity_attempt: caller.activity_attempt,
            program,
            llm,
        }
    }

    /// What the tool-use loop gets to run its tools in the sandbox (`client`, `endpoint`).
    fn loop_env<'a, S: ProgressSink>(
        &'a self,
        req: &RunAgentRequest,
        (client, endpoint): (SandboxProvisionerClient<Channel>, String),
        charger: Option<Charger>,
        caller: Caller<'a, S>,
    ) -> agent_loop::Env<'a, S> {
        // A running loop's branch point is a snapshot at the sandbox's owner; the loop
        // keeps its conversation itself before it (its driver has no CLI home).
        let snapshotter = Snapshotter::of(req, &client, &endpoint);
        let registered = self
            .loops
            .register(&req.run_id, req.fork, Captures::new(snapshotter));
        agent_loop::Env {
            registered,
            drivers: &self.drivers,
            sandbox: Sandbox {
                client,
                endpoint,
                sandbox_id: req.sandbox_id.clone(),
                env: HashMap::from([
                    ("FORKYARD_RUN_ID".to_owned(), req.run_id.clone()),
                    ("FORKYARD_FORK".to_owned(), req.fork.to_string()),
                ]),
            },
            charger,
            store: self.store.as_ref(),
            sink: caller.sink,
            heartbeat: self.heartbeat,
            cancelled: caller.cancelled,
            resume: caller.resume,
            activity_attempt: caller.activity_attempt,
        }
    }
}
