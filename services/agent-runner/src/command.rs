//! The `command` driver: a shell command run inside the sandbox with the prompt in
//! `FORKYARD_PROMPT`. The command runs through the provisioner's `ExecStream`; dropping
//! that call (on cancellation or a refused charge) makes the provisioner kill everything
//! the command started.
//!
//! Agent CLIs that stream usage (`claude -p --output-format stream-json --verbose`,
//! `codex exec --json`) are charged as they go: each usage-bearing line is priced from
//! the table (by the model the CLI names, else the spec's) and charged to the ledger
//! under `<charge_key>/turn-<n>`, n continuing from a failed attempt's last heartbeat as
//! with the LLM drivers. At the end the CLI's own total reconciles: the result's
//! `cost_micros` is its price (`total_cost_usd`, else its total usage priced), at least
//! what was charged; the fork's Commit, whose amount includes the charges, posts only the
//! rest. A CLI that prints one result at the end (`--output-format json`) is so charged
//! by the Commit alone, as before.

use crate::{
    charge::Charger,
    command_meter::{Lines, Meter},
    error::AgentError,
    models::Models,
    transcript::{ArtifactStore, Transcript},
    usage_stream::{Reading, UsageStream},
};
use forkyard_common::grpc_telemetry::TracedChannel as Channel;
use forkyard_common::text::tail;
use forkyard_proto::{
    agent::v1::{AgentProgress, RunAgentRequest, RunAgentResponse},
    common::v1::Usage,
    sandbox::v1::{
        ExecRequest, ExecResponse, exec_event::Event,
        sandbox_provisioner_client::SandboxProvisionerClient,
    },
};
use serde_json::json;
use std::{
    collections::HashMap,
    future::Future,
    pin::Pin,
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
}

fn sandbox_error(req: &RunAgentRequest, endpoint: &str, s: &tonic::Status) -> AgentError {
    match s.code() {
        tonic::Code::Unavailable
        | tonic::Code::Unknown
        | tonic::Code::Internal
        | tonic::Code::DeadlineExceeded
        | tonic::Code::Cancelled => AgentError::Unavailable {
            endpoint: endpoint.to_owned(),
            message: s.message().to_owned(),
        },
        _ => AgentError::Sandbox {
            sandbox_id: req.sandbox_id.clone(),
            message: s.message().to_owned(),
        },
    }
}

/// Run the command, charging usage as it streams and reporting progress every
/// `heartbeat`, until it exits, `cancelled` resolves or a charge is refused (then the
/// stream is dropped, which kills the command).
pub async fn run<S: ProgressSink>(
    req: &RunAgentRequest,
    env: Env<'_, S>,
) -> Result<RunAgentResponse, AgentError> {
    let command = validate(req)?;
    let Env {
        mut client,
        endpoint,
        sink,
        heartbeat,
        mut cancelled,
        models,
        charger,
        store,
        resume,
        activity_attempt,
    } = env;
    let spec_model = req
        .agent
        .as_ref()
        .map_or(String::new(), |a| a.model.clone());
    let key = ArtifactStore::key(&req.run_id, req.fork, req.attempt);
    let mut transcript = match (store, &key) {
        (Some(store), Some(key)) => store.open(key).unwrap_or_else(|e| {
            tracing::warn!(key = %key, error = %e, "cannot open transcript");
            Transcript::none()
        }),
        _ => Transcript::none(),
    };
    let resume = resume.filter(|p| p.turns > 0 || p.charged_micros > 0);
    if let Some(r) = &resume {
        transcript.write(&json!({
            "type": "resume", "activity_attempt": activity_attempt, "turns": r.turns,
            "cost_micros": r.cost_micros, "charged_micros": r.charged_micros,
        }));
    } else {
        transcript.write(&json!({
            "type": "start", "run_id": req.run_id, "fork": req.fork, "attempt": req.attempt.max(1),
            "driver": "command", "model": spec_model,
        }));
    }
    let mut meter = Meter {
        req,
        models,
        spec_model,
        sink,
        started: Instant::now(),
        progress: resume.unwrap_or_default(),
        charger,
        transcript,
        transcript_output: 0,
        run_usage: Usage::default(),
        run_priced: 0,
        total: None,
    };
    // A retried attempt's cost so far is at least what the ledger was charged.
    meter.progress.cost_micros = meter
        .progress
        .cost_micros
        .max(meter.progress.charged_micros);

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
        ..Default::default()
    };
    let cancel = |meter: &mut Meter<'_, S>| {
        meter
            .transcript
            .write(&json!({"type": "end", "reason": "cancelled", "turns": meter.progress.turns}));
        tracing::info!(run_id = %req.run_id, fork = req.fork, sandbox_id = %req.sandbox_id, "agent cancelled, killing its command");
        AgentError::Cancelled
    };
    let mut stream = tokio::select! {
        res = client.exec_stream(exec) => res.map_err(|s| sandbox_error(req, &endpoint, &s))?.into_inner(),
        () = &mut cancelled => return Err(cancel(&mut meter)),
    };
    let mut ticker = crate::command_meter::first_beat_after(heartbeat);
    let mut stdout = Lines::default();
    let mut stderr = String::new();
    let mut readings = UsageStream::default();
    let exit: ExecResponse = loop {
        let event = tokio::select! {
            ev = stream.message() => ev.map_err(|s| sandbox_error(req, &endpoint, &s))?,
            _ = ticker.tick() => {
                meter.beat("command running").await;
                continue;
            }
            () = &mut cancelled => return Err(cancel(&mut meter)),
        };
        let lines = match event.and_then(|e| e.event) {
            Some(Event::Stdout(chunk)) => stdout.push(&chunk),
            Some(Event::Stderr(chunk)) => {
                stderr.push_str(&String::from_utf8_lossy(&chunk));
                if stderr.len() > 2 * OUTPUT_TAIL_BYTES {
                    stderr = tail(&stderr, OUTPUT_TAIL_BYTES).to_owned();
                }
                continue;
            }
            Some(Event::Exit(exit)) => break exit,
            None => {
                return Err(AgentError::Unavailable {
                    endpoint: endpoint.clone(),
                    message: "exec stream ended without the command's exit status".into(),
                });
            }
        };
        for line in lines {
            meter.record_output(&line);
            match readings.line(&line) {
                // Dropping `stream` on a refusal kills the command.
                Some(Reading::Turn { usage, model }) => meter.turn(usage, model).await?,
                Some(Reading::Total(t)) => meter.total = Some(t),
                None => {}
            }
        }
    };
    // Read on to the trailers: a call dropped before them ends as CANCELLED (its spans
    // marked failed) though the command exited normally.
    let _ = tokio::time::timeout(Duration::from_secs(5), async {
        while let Ok(Some(_)) = stream.message().await {}
    })
    .await;
    drop(stream);
    if let Some(line) = stdout.finish() {
        meter.record_output(&line);
        match readings.line(&line) {
            Some(Reading::Turn { usage, model }) => meter.turn(usage, model).await?,
            Some(Reading::Total(t)) => meter.total = Some(t),
            None => {}
        }
    }
    let kept = stdout.kept();
    meter.reconcile(&kept);
    let p = &meter.progress;
    // What the ledger holds is at least what was charged; never report less.
    let cost_micros = p.cost_micros.max(p.charged_micros);
    meter.transcript.write(&json!({
        "type": "end", "reason": if exit.timed_out { "timeout" } else { "exit" },
        "exit_code": exit.exit_code, "turns": p.turns, "cost_micros": cost_micros, "usage": p.usage,
    }));
    let mut output_tail = tail(&kept, OUTPUT_TAIL_BYTES).to_owned();
    if !stderr.is_empty() {
        output_tail.push_str("\n--- stderr ---\n");
        output_tail.push_str(tail(&stderr, OUTPUT_TAIL_BYTES));
    }
    let out = RunAgentResponse {
        exit_code: exit.exit_code,
        timed_out: exit.timed_out,
        output_tail,
        usage: Some(p.usage.unwrap_or_default()),
        cost_micros,
        duration_ms: meter.started.elapsed().as_millis() as u64,
        turns: p.turns,
        transcript_key: meter.transcript.key.clone(),
        ..Default::default()
    };
    // What a retry would resume from, should this completion be lost; a command that
    // reported no usage leaves nothing to resume (and spares Temporal a write per fork).
    if p.turns > 0 || p.charged_micros > 0 || p.cost_micros > 0 {
        meter.beat("command exited").await;
    }
    Ok(out)
}
