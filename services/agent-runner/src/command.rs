//! The `command` driver: a shell command run inside the sandbox with the prompt in
//! `FORKYARD_PROMPT`. The command runs through the provisioner's `Exec`; dropping that
//! call (on cancellation) makes the provisioner kill everything the command started.

use crate::{error::AgentError, models::Models, usage};
use forkyard_common::grpc_telemetry::TracedChannel as Channel;
use forkyard_common::text::tail;
use forkyard_proto::{
    agent::v1::{AgentProgress, RunAgentRequest, RunAgentResponse},
    sandbox::v1::{ExecRequest, sandbox_provisioner_client::SandboxProvisionerClient},
};
use std::{
    collections::HashMap,
    future::Future,
    time::{Duration, Instant},
};

const OUTPUT_TAIL_BYTES: usize = 4096;

/// Where progress goes while the agent runs (activity heartbeats, or nowhere).
pub trait ProgressSink {
    fn report(&self, progress: AgentProgress) -> impl Future<Output = ()>;
}

pub struct NoProgress;
impl ProgressSink for NoProgress {
    async fn report(&self, _: AgentProgress) {}
}

pub fn validate(req: &RunAgentRequest) -> Result<String, AgentError> {
    let agent = req
        .agent
        .as_ref()
        .ok_or_else(|| AgentError::InvalidArgument("agent: missing".into()))?;
    let driver = if agent.driver.is_empty() {
        "command"
    } else {
        agent.driver.as_str()
    };
    if driver != "command" {
        return Err(AgentError::InvalidArgument(format!(
            "agent.driver: {driver:?} is not the command driver"
        )));
    }
    if agent.command.trim().is_empty() {
        return Err(AgentError::InvalidArgument(
            "agent.command: is empty".into(),
        ));
    }
    if req.sandbox_id.is_empty() {
        return Err(AgentError::InvalidArgument("sandbox_id: is empty".into()));
    }
    Ok(agent.command.clone())
}

/// Run the command, reporting progress every `heartbeat`, until it exits or `cancelled`
/// resolves (then the exec call is dropped, which kills the command).
pub async fn run(
    mut client: SandboxProvisionerClient<Channel>,
    endpoint: &str,
    req: &RunAgentRequest,
    sink: &impl ProgressSink,
    heartbeat: Duration,
    cancelled: impl Future<Output = ()>,
    models: &Models,
) -> Result<RunAgentResponse, AgentError> {
    let command = validate(req)?;
    let env = HashMap::from([
        ("FORKYARD_PROMPT".to_owned(), req.prompt.clone()),
        ("FORKYARD_RUN_ID".to_owned(), req.run_id.clone()),
        ("FORKYARD_FORK".to_owned(), req.fork.to_string()),
    ]);
    let exec = ExecRequest {
        sandbox_id: req.sandbox_id.clone(),
        argv: vec!["sh".into(), "-c".into(), command],
        env,
        timeout_secs: req.timeout_secs,
    };
    let started = Instant::now();
    let call = client.exec(exec);
    tokio::pin!(call);
    tokio::pin!(cancelled);
    let mut ticker = tokio::time::interval(heartbeat);
    let response = loop {
        tokio::select! {
            res = &mut call => break res,
            _ = ticker.tick() => {
                sink.report(AgentProgress {
                    elapsed_ms: started.elapsed().as_millis() as u64,
                    turns: 0,
                    cost_micros: 0,
                    last_action: "command running".into(),
                    ..Default::default()
                }).await;
            }
            () = &mut cancelled => {
                tracing::info!(run_id = %req.run_id, fork = req.fork, sandbox_id = %req.sandbox_id, "agent cancelled, killing its command");
                return Err(AgentError::Cancelled);
            }
        }
    };
    let out = response
        .map_err(|s| match s.code() {
            tonic::Code::Unavailable
            | tonic::Code::Unknown
            | tonic::Code::Internal
            | tonic::Code::DeadlineExceeded => AgentError::Unavailable {
                endpoint: endpoint.to_owned(),
                message: s.message().to_owned(),
            },
            _ => AgentError::Sandbox {
                sandbox_id: req.sandbox_id.clone(),
                message: s.message().to_owned(),
            },
        })?
        .into_inner();
    let reported = usage::from_stdout(&out.stdout).unwrap_or_default();
    // CLIs that report tokens but no price (e.g. `codex exec --json`) are priced from
    // the table by the spec's model.
    let model = req.agent.as_ref().map_or("", |a| a.model.as_str());
    let cost_micros = reported
        .cost_micros
        .unwrap_or_else(|| models.price(model).cost_micros(&reported.usage));
    let mut output_tail = tail(&out.stdout, OUTPUT_TAIL_BYTES).to_owned();
    if !out.stderr.is_empty() {
        output_tail.push_str("\n--- stderr ---\n");
        output_tail.push_str(tail(&out.stderr, OUTPUT_TAIL_BYTES));
    }
    Ok(RunAgentResponse {
        exit_code: out.exit_code,
        timed_out: out.timed_out,
        output_tail,
        usage: Some(reported.usage),
        cost_micros,
        duration_ms: started.elapsed().as_millis() as u64,
        ..Default::default()
    })
}
