//! The tool-use loop of the `anthropic` and `openai` drivers: ask the model, run the
//! tool calls in the sandbox, hand back the results, until the model ends its turn, the
//! turn limit, the fork's timeout, the budget, or cancellation.
//!
//! After every model turn the turn is priced, charged to the ledger (key
//! `<charge_key>/turn-<n>`) and reported in a heartbeat. A retried activity attempt
//! starts from its last heartbeat: turns, tokens and cost carry over, turn numbers (and
//! so charge keys) continue, and the conversation resumes from the transcript's last
//! checkpoint when this runner has it.

mod clock;
mod kept;
mod turn;

use crate::{
    charge::{Charger, LedgerOutage},
    drivers::{Choice, Drivers},
    error::AgentError,
    llm::{Provider, anthropic::Anthropic, openai::OpenAi},
    progress::{ProgressSink, first_beat_after},
    tools::{self, Sandbox},
    transcript::{ArtifactStore, Transcript},
};
use clock::{Loop, Stop};
use forkyard_proto::agent::v1::{AgentProgress, RunAgentRequest, RunAgentResponse};
use serde_json::{Value, json};
use std::{
    future::Future,
    ops::ControlFlow,
    pin::Pin,
    time::{Duration, Instant},
};
use turn::{Conversation, End};

const DEFAULT_TIMEOUT_SECS: u64 = 600;
const OUTPUT_TAIL_BYTES: usize = 4096;
/// Exit code reported when the agent stopped at the turn limit (the fork fails).
pub const TURN_LIMIT_EXIT: i32 = 2;

/// What the loop needs from its caller besides the request.
pub struct Env<'a, S: ProgressSink> {
    pub drivers: &'a Drivers,
    pub sandbox: Sandbox,
    pub charger: Option<Charger>,
    pub store: Option<&'a ArtifactStore>,
    pub sink: &'a S,
    pub heartbeat: Duration,
    pub cancelled: Pin<Box<dyn Future<Output = ()> + Send + 'a>>,
    /// The last heartbeat of a failed attempt of this activity.
    pub resume: Option<AgentProgress>,
    pub activity_attempt: u32,
    /// Where a branch point of the running loop is asked (`crate::branch_point`).
    pub registered: crate::loops::RegisteredLoop,
}

pub async fn run<S: ProgressSink>(
    req: &RunAgentRequest,
    env: Env<'_, S>,
) -> Result<RunAgentResponse, AgentError> {
    let (choice, max_turns) = checked(req, env.drivers)?;
    let Env {
        drivers,
        sandbox,
        charger,
        store,
        sink,
        heartbeat,
        cancelled,
        resume,
        activity_attempt,
        registered,
    } = env;
    // Its session: what a branch of this fork continues (fork trees), from its end or
    // from a point taken while it runs.
    let session = uuid::Uuid::new_v4().to_string();
    registered.captures.set_session(&session);
    let mut conversation = Conversation {
        req,
        provider: provider(drivers, &choice, &req.prompt),
        sandbox,
        charger,
        price: drivers.models.price(&choice.model),
        max_turns,
        written: 0,
        point: turn::PointAt {
            captures: registered.captures.clone(),
            session: session.clone(),
            driver: choice.driver.clone(),
        },
    };
    let timeout = match req.timeout_secs {
        0 => DEFAULT_TIMEOUT_SECS,
        t => u64::from(t),
    };
    let started = Instant::now();
    let (transcript, earlier) = open_transcript(store, req);
    let mut lp = Loop {
        sink,
        cancelled,
        started,
        deadline: started + Duration::from_secs(timeout),
        ticker: first_beat_after(heartbeat),
        progress: AgentProgress::default(),
        transcript,
        ledger_outage: LedgerOutage::default(),
    };
    let restored = match resume.filter(|p| p.turns > 0) {
        Some(r) => conversation.resume(&mut lp, r, &earlier, activity_attempt),
        None => {
            conversation.start(&mut lp, &choice);
            false
        }
    };
    if !restored {
        conversation
            .continue_parent(&mut lp, &choice.driver)
            .await?;
    }
    let turns_so_far = lp.progress.turns;
    conversation.write_messages(&mut lp.transcript, turns_so_far);
    let end = loop {
        if let ControlFlow::Break(end) = conversation.turn(&mut lp).await? {
            break end;
        }
    };
    if !matches!(end, End::Stopped(Stop::Cancelled)) {
        let messages = conversation.provider.messages();
        kept::keep(
            &mut conversation.sandbox,
            req,
            &session,
            &choice.driver,
            messages,
        )
        .await;
    }
    let mut response = finish(req, lp, end, timeout)?;
    response.session_id = session;
    Ok(response)
}

/// The driver and model the request's agent asks for, and its turn limit;
/// INVALID_ARGUMENT naming the field when the request cannot run.
fn checked(req: &RunAgentRequest, drivers: &Drivers) -> Result<(Choice, u32), AgentError> {
    let agent = req
        .agent
        .as_ref()
        .ok_or_else(|| AgentError::InvalidArgument("agent: missing".into()))?;
    let choice = drivers.check(agent)?;
    if req.sandbox_id.is_empty() {
        return Err(AgentError::InvalidArgument("sandbox_id: is empty".into()));
    }
    if req.prompt.trim().is_empty() {
        return Err(AgentError::InvalidArgument("prompt: is empty".into()));
    }
    let max_turns = if agent.max_turns > 0 {
        agent.max_turns
    } else {
        drivers.max_turns
    };
    Ok((choice, max_turns))
}

/// The model's side of the conversation, in the wire format of `choice`'s driver,
/// starting from `prompt`.
fn provider(drivers: &Drivers, choice: &Choice, prompt: &str) -> Provider {
    let specs = tools::specs();
    let d = drivers;
    match choice.driver.as_str() {
        "anthropic" => Provider::Anthropic(Anthropic::new(
            d.http.clone(),
            d.anthropic.clone(),
            choice.model.clone(),
            &specs,
            prompt,
        )),
        _ => Provider::OpenAi(OpenAi::new(
            d.http.clone(),
            d.openai.clone(),
            choice.model.clone(),
            &specs,
            prompt,
        )),
    }
}

/// This attempt's transcript and the lines already under its key (a retried attempt
/// resumes from them); none without a store or a safe key.
fn open_transcript(
    store: Option<&ArtifactStore>,
    req: &RunAgentRequest,
) -> (Transcript, Vec<Value>) {
    let key = ArtifactStore::key(&req.run_id, req.fork, req.attempt);
    match (store, &key) {
        (Some(store), Some(key)) => {
            let earlier = store.read_lines(key);
            let t = store.open(key).unwrap_or_else(|e| {
                tracing::warn!(key = %key, error = %e, "cannot open transcript");
                Transcript::none()
            });
            (t, earlier)
        }
        _ => (Transcript::none(), Vec::new()),
    }
}

/// The response for how the conversation ended (the transcript's last line written),
/// or CANCELLED.
fn finish<S: ProgressSink>(
    req: &RunAgentRequest,
    mut lp: Loop<'_, S>,
    end: End,
    timeout: u64,
) -> Result<RunAgentResponse, AgentError> {
    let p = &lp.progress;
    // What the ledger holds is at least what was charged; never report less.
    let cost_micros = p.cost_micros.max(p.charged_micros);
    let over_disk_limit = matches!(end, End::DiskLimit);
    let (exit_code, timed_out, reason, text) = match end {
        End::Answered(text) => (0, false, "end_turn", text),
        End::TurnLimit(max_turns) => (
            TURN_LIMIT_EXIT,
            false,
            "turn_limit",
            format!("stopped at the turn limit ({max_turns} turns)"),
        ),
        End::DiskLimit => (
            -1,
            false,
            "disk_limit",
            "stopped: the workspace grew past the sandbox's disk limit".to_owned(),
        ),
        End::Stopped(Stop::Deadline) => (
            -1,
            true,
            "timeout",
            format!("agent did not finish within {timeout} s"),
        ),
        End::Stopped(Stop::Cancelled) => {
            lp.transcript
                .write(&json!({"type": "end", "reason": "cancelled", "turns": p.turns}));
            tracing::info!(run_id = %req.run_id, fork = req.fork, "agent cancelled");
            return Err(AgentError::Cancelled);
        }
    };
    lp.transcript.write(&json!({
        "type": "end", "reason": reason,
        "turns": p.turns, "cost_micros": cost_micros, "usage": p.usage,
    }));
    Ok(RunAgentResponse {
        exit_code,
        timed_out,
        output_tail: forkyard_common::text::tail(
            &text,
            OUTPUT_TAIL_BYTES.min(crate::command::tail_bytes(req)),
        )
        .to_owned(),
        usage: p.usage,
        cost_micros,
        duration_ms: lp.started.elapsed().as_millis() as u64,
        turns: p.turns,
        workspace_over_limit: over_disk_limit,
        transcript_key: lp.transcript.key.clone(),
        ..Default::default()
    })
}
