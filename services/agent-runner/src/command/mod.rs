//! The command-like drivers: a shell command run inside the sandbox with the prompt in
//! `FORKYARD_PROMPT` (`command`, or a preset's CLI invocation: `claude-code`, `codex`;
//! see [`crate::presets`]). The command runs through the provisioner's `ExecStream`;
//! dropping that call (on cancellation or a spent budget) makes the provisioner kill
//! everything the command started.
//!
//! With the runner's LLM gateway (the default), the command's model traffic is metered
//! there: the fork gets a token for its sandbox, every response's usage is priced and
//! charged as it completes, and the fork's cost is exactly what its requests used,
//! whatever the CLI prints. A refused charge ends the command (`BUDGET_EXCEEDED`).
//!
//! Without the gateway (`--llm-listen ''`), agent CLIs that stream usage on stdout
//! (`claude -p --output-format stream-json --verbose`, `codex exec --json`) are charged
//! as they go: each usage-bearing line is priced from the table (by the model the CLI
//! names, else the spec's) and charged under `<charge_key>/turn-<n>`, n continuing from
//! a failed attempt's last heartbeat as with the LLM drivers. At the end the CLI's own
//! total reconciles: the result's `cost_micros` is its price (`total_cost_usd`, else its
//! total usage priced), at least what was charged; the fork's Commit, whose amount
//! includes the charges, posts only the rest.

mod output;
mod running;
mod stop;

pub(crate) use output::tail_bytes;

use crate::{
    charge::Charger,
    command_meter::{Lines, Meter},
    error::AgentError,
    llm_gateway::{
        LlmGateway,
        capture::Snapshotter,
        grants::{Allowed, GrantHandle, GrantSpec},
    },
    models::Models,
    presets::Program,
    progress::ProgressSink,
    sandbox_cost::SandboxCost,
    transcript::{ArtifactStore, Transcript},
    usage_stream::UsageStream,
};
use forkyard_common::grpc_telemetry::TracedChannel as Channel;
use forkyard_proto::{
    agent::v1::{AgentProgress, RunAgentRequest, RunAgentResponse},
    common::v1::Usage,
    sandbox::v1::{ExecRequest, sandbox_provisioner_client::SandboxProvisionerClient},
};
use running::Running;
use serde_json::{Value, json};
use std::{
    future::Future,
    pin::Pin,
    time::{Duration, Instant},
};

/// What the command driver needs besides the request.
pub struct Env<'a, S: ProgressSink> {
    pub client: SandboxProvisionerClient<Channel>,
    pub endpoint: String,
    pub sink: &'a S,
    pub heartbeat: Duration,
    pub cancelled: Pin<Box<dyn Future<Output = ()> + Send + 'a>>,
    pub models: &'a Models,
    /// Charges each usage report; none without a reservation.
    pub charger: Option<Charger>,
    pub store: Option<&'a ArtifactStore>,
    /// The last heartbeat of a failed attempt of this activity.
    pub resume: Option<AgentProgress>,
    pub activity_attempt: u32,
    /// What to run (the command, or a preset's invocation).
    pub program: Program,
    /// The runner's LLM gateway and the models the fork may use; `None`: no gateway,
    /// usage is read from stdout.
    pub llm: Option<(&'a std::sync::Arc<LlmGateway>, Allowed)>,
}

/// Run the command, charging usage as it streams and reporting progress every
/// `heartbeat`, until it exits, `cancelled` resolves or a charge is refused (then the
/// stream is dropped, which kills the command).
pub async fn run<S: ProgressSink>(
    req: &RunAgentRequest,
    mut env: Env<'_, S>,
) -> Result<RunAgentResponse, AgentError> {
    let resume = env
        .resume
        .take()
        .filter(|p| p.turns > 0 || p.charged_micros > 0);
    let mut transcript = open_transcript(env.store, req);
    transcript.write(&first_line(req, &env, resume.as_ref()));
    // Once the agent uses the gateway, its charges are the gateway's (one per request)
    // and stdout is only the transcript; a command that never calls a model through it
    // is charged what it reports on stdout, as without a gateway.
    let grant = mint_grant(req, &env)?;
    let meter = meter(req, &env, resume, transcript);
    let copied = copy_parent_transcript(req, env.store, env.client.clone()).await;
    let mut exec = exec_request(req, &env, grant.as_ref());
    exec.env.extend(crate::branch::env(req, copied));
    let Env {
        client,
        endpoint,
        heartbeat,
        mut cancelled,
        charger,
        activity_attempt,
        ..
    } = env;
    let mut running = Running {
        meter,
        grant: grant.as_ref(),
        client,
        endpoint,
        sandbox_cost: SandboxCost::new(&req.sandbox_id, charger, activity_attempt),
        stdout: Lines::default(),
        stderr: Default::default(),
        readings: UsageStream::default(),
        session_id: String::new(),
    };
    let mut stream = running.start(exec, &mut cancelled).await?;
    let exit = running
        .follow(&mut stream, heartbeat, &mut cancelled)
        .await?;
    running.drain(stream).await?;
    running.finish(exit).await
}

/// A branched fork's parent's transcript, copied into the workspace's git directory
/// (`crate::branch::PARENT_TRANSCRIPT`) when this runner holds it: `true` if it is there.
async fn copy_parent_transcript(
    req: &RunAgentRequest,
    store: Option<&ArtifactStore>,
    mut client: SandboxProvisionerClient<Channel>,
) -> bool {
    let (Some(b), Some(store)) = (req.branch_of.as_ref(), store) else {
        return false;
    };
    // Its latest attempt's, when this replica ran it.
    let Some((_, text, _)) = store.get(&req.run_id, b.parent_fork, 0) else {
        return false;
    };
    let content = text.into_bytes();
    let write = forkyard_proto::sandbox::v1::WriteFileRequest {
        sandbox_id: req.sandbox_id.clone(),
        path: crate::branch::PARENT_TRANSCRIPT.into(),
        content,
        mode: 0o644,
    };
    match client.write_file(write).await {
        Ok(_) => true,
        Err(e) => {
            tracing::warn!(run_id = %req.run_id, fork = req.fork, error = %e, "parent transcript not copied into the branch");
            false
        }
    }
}

/// This attempt's transcript; none without a store or a safe key.
fn open_transcript(store: Option<&ArtifactStore>, req: &RunAgentRequest) -> Transcript {
    let key = ArtifactStore::key(&req.run_id, req.fork, req.attempt);
    match (store, &key) {
        (Some(store), Some(key)) => store.open(key).unwrap_or_else(|e| {
            tracing::warn!(key = %key, error = %e, "cannot open transcript");
            Transcript::none()
        }),
        _ => Transcript::none(),
    }
}

/// The transcript's first line: where a retried attempt resumes from, or what starts.
fn first_line<S: ProgressSink>(
    req: &RunAgentRequest,
    env: &Env<'_, S>,
    resume: Option<&AgentProgress>,
) -> Value {
    match resume {
        Some(r) => json!({
            "type": "resume", "activity_attempt": env.activity_attempt, "turns": r.turns,
            "cost_micros": r.cost_micros, "charged_micros": r.charged_micros,
        }),
        None => json!({
            "type": "start", "run_id": req.run_id, "fork": req.fork, "attempt": req.attempt.max(1),
            "driver": req.agent.as_ref().map_or("command", |a| if a.driver.is_empty() { "command" } else { a.driver.as_str() }),
            "model": env.program.model, "llm_gateway": env.llm.is_some(),
        }),
    }
}

/// The fork's token at the runner's LLM gateway, live as long as the returned handle;
/// none without the gateway. A sandbox off the mesh's hosts (E2B) reaches the gateway
/// only at the operator's public URL: without one its agent is refused, never run with
/// a model endpoint it cannot reach.
fn mint_grant<S: ProgressSink>(
    req: &RunAgentRequest,
    env: &Env<'_, S>,
) -> Result<Option<GrantHandle>, AgentError> {
    let Some((gateway, allowed)) = env.llm.as_ref() else {
        return Ok(None);
    };
    let remote = forkyard_proto::remote_sandbox(&req.sandbox_id);
    if remote && gateway.public_url.is_none() {
        return Err(AgentError::Sandbox {
            sandbox_id: req.sandbox_id.clone(),
            message: "runs off the mesh's hosts and this agent runner has no LLM gateway URL it can reach (set FORKYARD_PUBLIC_LLM_GATEWAY_URL and FORKYARD_LLM_PUBLIC_LISTEN)".into(),
        });
    }
    Ok(Some(gateway.grants.mint(GrantSpec {
        sandbox_id: req.sandbox_id.clone(),
        run_id: req.run_id.clone(),
        fork: req.fork,
        allowed: allowed.clone(),
        charger: env.charger.clone(),
        ledger_grace: crate::charge::LEDGER_OUTAGE_GRACE,
        remote,
        // A running fork's branch point is a snapshot at the sandbox's owner.
        snapshotter: Snapshotter::of(req, &env.client, &env.endpoint),
    })))
}

/// The meter of this run of the command, from `resume` (a failed attempt's last beat)
/// on.
fn meter<'a, S: ProgressSink>(
    req: &'a RunAgentRequest,
    env: &Env<'a, S>,
    resume: Option<AgentProgress>,
    transcript: Transcript,
) -> Meter<'a, S> {
    let mut meter = Meter {
        req,
        models: env.models,
        spec_model: env.program.model.clone(),
        sink: env.sink,
        started: Instant::now(),
        progress: resume.unwrap_or_default(),
        charger: env.charger.clone(),
        transcript,
        transcript_output: 0,
        run_usage: Usage::default(),
        run_priced: 0,
        total: None,
        ledger_outage: Default::default(),
    };
    // A retried attempt's cost so far is at least what the ledger was charged.
    meter.progress.cost_micros = meter
        .progress
        .cost_micros
        .max(meter.progress.charged_micros);
    meter
}

/// The provisioner's call that runs the program: `sh -c <script>` with the prompt, the
/// run's names and (with the gateway) the provider variables in its environment.
fn exec_request<S: ProgressSink>(
    req: &RunAgentRequest,
    env: &Env<'_, S>,
    grant: Option<&GrantHandle>,
) -> ExecRequest {
    let program = &env.program;
    let mut vars = program.env.clone();
    vars.extend([
        ("FORKYARD_PROMPT".to_owned(), req.prompt.clone()),
        ("FORKYARD_RUN_ID".to_owned(), req.run_id.clone()),
        ("FORKYARD_FORK".to_owned(), req.fork.to_string()),
    ]);
    // A remote sandbox (E2B) dials the public URL itself; a local one gets the relay.
    let remote = forkyard_proto::remote_sandbox(&req.sandbox_id);
    let public_url = env.llm.as_ref().and_then(|(g, _)| g.public_url.as_deref());
    if let Some(g) = grant {
        vars.extend(crate::presets::gateway_env(
            g.token(),
            public_url.filter(|_| remote),
        ));
    }
    ExecRequest {
        sandbox_id: req.sandbox_id.clone(),
        argv: vec!["sh".into(), "-c".into(), program.script.clone()],
        env: vars,
        timeout_secs: req.timeout_secs,
        llm_gateway: env
            .llm
            .as_ref()
            .filter(|_| !remote)
            .map_or(String::new(), |(g, _)| g.advertise.clone()),
        // Streamed: nothing is captured by the provisioner.
        output_tail_bytes: 0,
    }
}
