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

use crate::{
    charge::Charger,
    command_meter::{Lines, Meter, add_totals},
    error::AgentError,
    llm_gateway::{
        LlmGateway,
        grants::{Allowed, GrantHandle, GrantSpec, Stop},
    },
    models::Models,
    presets::Program,
    progress::{ProgressSink, first_beat_after},
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
    future::Future,
    pin::Pin,
    time::{Duration, Instant},
};

const OUTPUT_TAIL_BYTES: usize = 4096;
/// How long the end of a command waits for its last requests' charges.
const SETTLE: Duration = Duration::from_secs(15);

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

/// The most bytes of a response's `output_tail` the caller allows (`output_tail_bytes`;
/// its stdout and stderr parts half each): 8 KiB unless it asked for less, at least 512.
pub(crate) fn tail_bytes(req: &RunAgentRequest) -> usize {
    match usize::try_from(req.output_tail_bytes) {
        Ok(n @ 1..) => n.clamp(512, 2 * OUTPUT_TAIL_BYTES),
        _ => 2 * OUTPUT_TAIL_BYTES,
    }
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
        program,
        llm,
    } = env;
    let spec_model = program.model.clone();
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
            "driver": req.agent.as_ref().map_or("command", |a| if a.driver.is_empty() { "command" } else { a.driver.as_str() }),
            "model": spec_model, "llm_gateway": llm.is_some(),
        }));
    }
    // Once the agent uses the gateway, its charges are the gateway's (one per request)
    // and stdout is only the transcript; a command that never calls a model through it
    // is charged what it reports on stdout, as without a gateway.
    let grant = llm.as_ref().map(|(gateway, allowed)| {
        gateway.grants.mint(GrantSpec {
            sandbox_id: req.sandbox_id.clone(),
            run_id: req.run_id.clone(),
            fork: req.fork,
            allowed: allowed.clone(),
            charger: charger.clone(),
            ledger_grace: crate::charge::LEDGER_OUTAGE_GRACE,
        })
    });
    let mut meter = Meter {
        req,
        models,
        spec_model,
        sink,
        started: Instant::now(),
        progress: resume.unwrap_or_default(),
        charger: charger.clone(),
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

    let mut env = program.env.clone();
    env.extend([
        ("FORKYARD_PROMPT".to_owned(), req.prompt.clone()),
        ("FORKYARD_RUN_ID".to_owned(), req.run_id.clone()),
        ("FORKYARD_FORK".to_owned(), req.fork.to_string()),
    ]);
    if let Some(g) = &grant {
        env.extend(crate::presets::gateway_env(g.token()));
    }
    let exec = ExecRequest {
        sandbox_id: req.sandbox_id.clone(),
        argv: vec!["sh".into(), "-c".into(), program.script.clone()],
        env,
        timeout_secs: req.timeout_secs,
        llm_gateway: llm
            .as_ref()
            .map_or(String::new(), |(g, _)| g.advertise.clone()),
        // Streamed: nothing is captured by the provisioner.
        output_tail_bytes: 0,
    };
    let mut sandbox_cost =
        crate::sandbox_cost::SandboxCost::new(&req.sandbox_id, charger.clone(), activity_attempt);
    let stopped = async {
        match &grant {
            Some(g) => g.stopped().await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(stopped);
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
    let mut ticker = first_beat_after(heartbeat);
    let mut stdout = Lines::default();
    let mut stderr = String::new();
    let mut readings = UsageStream::default();
    let exit: ExecResponse = loop {
        let event = tokio::select! {
            ev = stream.message() => ev.map_err(|s| sandbox_error(req, &endpoint, &s))?,
            _ = ticker.tick() => {
                if let Err(e) = sandbox_cost.tick(&mut client, &mut meter.progress).await {
                    let why = e.to_string();
                    return Err(spent(&mut meter, grant.as_ref(), format!("sandbox time: {why}")).await);
                }
                let totals = grant.as_ref().filter(|g| g.used()).map(GrantHandle::totals);
                meter.beat_with("command running", totals.as_ref()).await;
                continue;
            }
            () = &mut cancelled => return Err(cancel(&mut meter)),
            why = &mut stopped => return Err(match why {
                Stop::Spent(why) => spent(&mut meter, grant.as_ref(), why).await,
                Stop::LedgerAway(why) => ledger_away(&mut meter, grant.as_ref(), why).await,
            }),
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
            if grant.as_ref().is_some_and(GrantHandle::used) {
                continue;
            }
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
        if !grant.as_ref().is_some_and(GrantHandle::used) {
            match readings.line(&line) {
                Some(Reading::Turn { usage, model }) => meter.turn(usage, model).await?,
                Some(Reading::Total(t)) => meter.total = Some(t),
                None => {}
            }
        }
    }
    let kept = stdout.kept();
    match grant.as_ref().filter(|g| g.used()) {
        Some(g) => {
            let totals = g.settle(SETTLE).await;
            if let Some(why) = totals.exhausted {
                return Err(spent(&mut meter, grant.as_ref(), why).await);
            }
            add_totals(&mut meter.progress, &totals);
            meter.write_gateway_totals(&totals);
            // The agent gave up because the model API failed it: worth another attempt
            // (the agent retry table), which resumes from this beat's charges.
            if exit.exit_code != 0 && !exit.timed_out && totals.upstream_failures > 0 {
                meter.beat("model api unavailable").await;
                return Err(AgentError::Model(crate::llm::LlmError::Unavailable {
                    status: totals.last_upstream_status,
                    attempts: totals.upstream_failures,
                    message: format!(
                        "the agent exited with {} after the model API failed {} of its requests",
                        exit.exit_code, totals.upstream_failures
                    ),
                }));
            }
        }
        None => meter.reconcile(&kept),
    }
    let p = &meter.progress;
    // What the ledger holds is at least what was charged; never report less.
    let cost_micros = p.cost_micros.max(p.charged_micros);
    meter.transcript.write(&json!({
        "type": "end", "reason": if exit.timed_out { "timeout" } else { "exit" },
        "exit_code": exit.exit_code, "turns": p.turns, "cost_micros": cost_micros, "usage": p.usage,
    }));
    let half = tail_bytes(req) / 2;
    let mut output_tail = tail(&kept, half).to_owned();
    if !stderr.is_empty() {
        output_tail.push_str("\n--- stderr ---\n");
        output_tail.push_str(tail(&stderr, half));
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
        sandbox_charged_micros: p.sandbox_charged_micros,
        workspace_over_limit: exit.workspace_over_limit,
        ..Default::default()
    };
    // What a retry would resume from, should this completion be lost; a command that
    // reported no usage leaves nothing to resume (and spares Temporal a write per fork).
    if p.turns > 0 || p.charged_micros > 0 || p.cost_micros > 0 {
        meter.beat("command exited").await;
    }
    Ok(out)
}

/// The agent's charges have not reached the ledger for too long: it is stopped, and the
/// attempt is retried (what it used is in its last beat, for the fork's commit).
async fn ledger_away<S: ProgressSink>(
    meter: &mut Meter<'_, S>,
    grant: Option<&GrantHandle>,
    why: String,
) -> AgentError {
    tracing::warn!(run_id = %meter.req.run_id, fork = meter.req.fork, "ledger away past the grace, stopping the agent");
    stop(meter, grant, "ledger away", &why).await;
    AgentError::Ledger {
        message: why,
        retry: true,
    }
}

/// The fork's reservation refused a request's charge: the command is stopped (its
/// stream dropped by the caller) and the fork ends `BUDGET_EXCEEDED`.
async fn spent<S: ProgressSink>(
    meter: &mut Meter<'_, S>,
    grant: Option<&GrantHandle>,
    why: String,
) -> AgentError {
    tracing::info!(run_id = %meter.req.run_id, fork = meter.req.fork, "fork budget spent, stopping its agent");
    stop(meter, grant, "budget spent", &why).await;
    let p = &meter.progress;
    AgentError::BudgetExceeded(format!(
        "{why}; the agent was stopped after {} model requests ({} micro-USD used, {} charged)",
        p.turns, p.cost_micros, p.charged_micros
    ))
}

/// What an agent stopped for `reason` leaves: the gateway's final totals in its progress
/// and transcript, the transcript's end, and a last beat.
async fn stop<S: ProgressSink>(
    meter: &mut Meter<'_, S>,
    grant: Option<&GrantHandle>,
    reason: &str,
    why: &str,
) {
    if let Some(g) = grant {
        let totals = g.settle(SETTLE).await;
        add_totals(&mut meter.progress, &totals);
        meter.write_gateway_totals(&totals);
    }
    let p = &meter.progress;
    meter.transcript.write(&json!({"type": "end", "reason": reason, "error": why, "turns": p.turns, "cost_micros": p.cost_micros}));
    meter.beat(&format!("stopped: {reason}")).await;
}
