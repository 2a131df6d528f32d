//! The tool-use loop of the `anthropic` and `openai` drivers: ask the model, run the
//! tool calls in the sandbox, hand back the results, until the model ends its turn, the
//! turn limit, the fork's timeout, the budget, or cancellation.
//!
//! After every model turn the turn is priced, charged to the ledger (key
//! `<charge_key>/turn-<n>`) and reported in a heartbeat. A retried activity attempt
//! starts from its last heartbeat: turns, tokens and cost carry over, turn numbers (and
//! so charge keys) continue, and the conversation resumes from the transcript's last
//! checkpoint when this runner has it.

use crate::{
    charge::{Charger, LEDGER_OUTAGE_GRACE, LedgerOutage},
    drivers::Drivers,
    error::AgentError,
    llm::{Provider, ToolOutput, anthropic::Anthropic, openai::OpenAi},
    progress::{ProgressSink, first_beat_after},
    tools::{self, Sandbox},
    transcript::{ArtifactStore, Transcript},
};
use forkyard_proto::agent::v1::{AgentProgress, RunAgentRequest, RunAgentResponse};
use serde_json::{Value, json};
use std::{
    future::Future,
    pin::Pin,
    time::{Duration, Instant},
};

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
}

enum Stop {
    Cancelled,
    Deadline,
}

struct Loop<'a, S: ProgressSink> {
    sink: &'a S,
    cancelled: Pin<Box<dyn Future<Output = ()> + Send + 'a>>,
    started: Instant,
    deadline: Instant,
    ticker: tokio::time::Interval,
    progress: AgentProgress,
    transcript: Transcript,
    /// Turns the ledger did not take.
    ledger_outage: LedgerOutage,
}

impl<S: ProgressSink> Loop<'_, S> {
    async fn beat(&mut self, action: &str) {
        self.progress.elapsed_ms = self.started.elapsed().as_millis() as u64;
        action.clone_into(&mut self.progress.last_action);
        self.sink.report(self.progress.clone()).await;
    }

    /// Await `fut`, heartbeating meanwhile; stop on cancellation or the deadline. On a
    /// stop `fut` is dropped: an in-flight model request is abandoned and an in-flight
    /// sandbox command is killed by the provisioner when its call goes away.
    async fn drive<T>(&mut self, fut: impl Future<Output = T>, action: &str) -> Result<T, Stop> {
        tokio::pin!(fut);
        let deadline = tokio::time::Instant::from_std(self.deadline);
        loop {
            tokio::select! {
                out = &mut fut => return Ok(out),
                () = &mut self.cancelled => return Err(Stop::Cancelled),
                () = tokio::time::sleep_until(deadline) => return Err(Stop::Deadline),
                _ = self.ticker.tick() => self.beat(action).await,
            }
        }
    }
}

fn resumed_messages(lines: &[Value], upto_turn: u32) -> Option<Vec<Value>> {
    // The last checkpoint (tool results handed back) at or before the heartbeat's turn.
    let count = lines
        .iter()
        .filter(|l| {
            l["type"] == "checkpoint"
                && l["turn"]
                    .as_u64()
                    .is_some_and(|t| t <= u64::from(upto_turn))
        })
        .filter_map(|l| l["messages"].as_u64())
        .next_back()? as usize;
    let msgs: Vec<Value> = lines
        .iter()
        .filter(|l| l["type"] == "message")
        .map(|l| l["message"].clone())
        .take(count)
        .collect();
    (msgs.len() == count).then_some(msgs)
}

pub async fn run<S: ProgressSink>(
    req: &RunAgentRequest,
    env: Env<'_, S>,
) -> Result<RunAgentResponse, AgentError> {
    let agent = req
        .agent
        .clone()
        .ok_or_else(|| AgentError::InvalidArgument("agent: missing".into()))?;
    let Env {
        drivers,
        mut sandbox,
        mut charger,
        store,
        sink,
        heartbeat,
        cancelled,
        resume,
        activity_attempt,
    } = env;
    let choice = drivers.check(&agent)?;
    if req.sandbox_id.is_empty() {
        return Err(AgentError::InvalidArgument("sandbox_id: is empty".into()));
    }
    if req.prompt.trim().is_empty() {
        return Err(AgentError::InvalidArgument("prompt: is empty".into()));
    }
    let price = drivers.models.price(&choice.model);
    let max_turns = if agent.max_turns > 0 {
        agent.max_turns
    } else {
        drivers.max_turns
    };
    let specs = tools::specs();
    let d = drivers;
    let mut provider = match choice.driver.as_str() {
        "anthropic" => Provider::Anthropic(Anthropic::new(
            d.http.clone(),
            d.anthropic.clone(),
            choice.model.clone(),
            &specs,
            &req.prompt,
        )),
        _ => Provider::OpenAi(OpenAi::new(
            d.http.clone(),
            d.openai.clone(),
            choice.model.clone(),
            &specs,
            &req.prompt,
        )),
    };
    let timeout = match req.timeout_secs {
        0 => DEFAULT_TIMEOUT_SECS,
        t => u64::from(t),
    };
    let started = Instant::now();
    let key = ArtifactStore::key(&req.run_id, req.fork, req.attempt);
    let (transcript, earlier) = match (store, &key) {
        (Some(store), Some(key)) => {
            let earlier = store.read_lines(key);
            let t = store.open(key).unwrap_or_else(|e| {
                tracing::warn!(key = %key, error = %e, "cannot open transcript");
                Transcript::none()
            });
            (t, earlier)
        }
        _ => (Transcript::none(), Vec::new()),
    };
    let ticker = first_beat_after(heartbeat);
    let resume = resume.filter(|p| p.turns > 0);
    let mut lp = Loop {
        sink,
        cancelled,
        started,
        deadline: started + Duration::from_secs(timeout),
        ticker,
        progress: AgentProgress::default(),
        transcript,
        ledger_outage: LedgerOutage::default(),
    };

    let mut written = 0;
    if let Some(r) = resume {
        let restored = resumed_messages(&earlier, r.turns);
        lp.transcript.write(&json!({
            "type": "resume", "activity_attempt": activity_attempt, "turns": r.turns,
            "cost_micros": r.cost_micros, "conversation_restored": restored.is_some(),
        }));
        if let Some(msgs) = restored {
            written = msgs.len();
            provider.restore(msgs);
        }
        tracing::info!(run_id = %req.run_id, fork = req.fork, turns = r.turns, restored = written > 0, "agent resumes from its last heartbeat");
        lp.progress = r;
    } else {
        lp.transcript.write(&json!({
            "type": "start", "run_id": req.run_id, "fork": req.fork, "attempt": req.attempt.max(1),
            "driver": choice.driver, "model": choice.model, "max_turns": max_turns,
        }));
    }
    let write_messages = |lp: &mut Loop<'_, S>, provider: &Provider, from: usize, turn: u32| {
        for m in &provider.messages()[from..] {
            lp.transcript
                .write(&json!({"type": "message", "turn": turn, "message": m}));
        }
        provider.messages().len()
    };
    let turns_so_far = lp.progress.turns;
    written = write_messages(&mut lp, &provider, written, turns_so_far);

    let mut over_disk_limit = false;
    let outcome: Result<(i32, String), Stop> = 'conversation: loop {
        if lp.progress.turns >= max_turns {
            break Ok((
                TURN_LIMIT_EXIT,
                format!("stopped at the turn limit ({max_turns} turns)"),
            ));
        }
        let turn = match lp
            .drive(provider.next_turn(), "waiting for the model")
            .await
        {
            Ok(t) => t?,
            Err(s) => break Err(s),
        };
        lp.progress.turns += 1;
        let n = lp.progress.turns;
        let cost = price.cost_micros(&turn.usage);
        let mut usage = lp.progress.usage.unwrap_or_default();
        crate::usage_sum::add(&mut usage, &turn.usage);
        lp.progress.usage = Some(usage);
        lp.progress.cost_micros += cost;
        written = write_messages(&mut lp, &provider, written, n);
        lp.transcript.write(&json!({
            "type": "usage", "turn": n, "input_tokens": turn.usage.input_tokens,
            "output_tokens": turn.usage.output_tokens, "cache_read_tokens": turn.usage.cache_read_tokens,
            "cache_write_tokens": turn.usage.cache_write_tokens, "cost_micros": cost,
            "stop_reason": turn.stop_reason,
        }));
        if let Some(charger) = charger.as_mut() {
            match charger.charge(n, cost).await {
                Ok(total) => {
                    lp.progress.charged_micros = lp.progress.charged_micros.max(total);
                    lp.ledger_outage.answered();
                }
                Err(AgentError::Ledger {
                    retry: true,
                    message,
                }) if lp.ledger_outage.failed() < LEDGER_OUTAGE_GRACE => {
                    tracing::warn!(run_id = %req.run_id, fork = req.fork, turn = n, error = %message, "ledger away: turn not charged yet, the agent goes on");
                    lp.transcript.write(&json!({"type": "charge_deferred", "turn": n, "cost_micros": cost, "error": message}));
                }
                Err(e) => {
                    lp.transcript.write(&json!({"type": "end", "reason": "charge refused", "error": e.to_string(), "turns": n}));
                    tracing::warn!(run_id = %req.run_id, fork = req.fork, turn = n, error = %e, "charge refused, stopping the agent");
                    lp.beat("stopped: charge refused").await;
                    // The fork's error then says how far the agent got.
                    return Err(match e {
                        AgentError::BudgetExceeded(m) => AgentError::BudgetExceeded(format!(
                            "{m}; the agent stopped after {} turns ({} micro-USD charged, turn {n} not)",
                            n - 1,
                            lp.progress.charged_micros
                        )),
                        other => other,
                    });
                }
            }
        }
        lp.beat(&format!("turn {n} done")).await;
        if turn.calls.is_empty() {
            break Ok((0, turn.text));
        }
        let mut outputs = Vec::with_capacity(turn.calls.len());
        for call in turn.calls {
            let what = tools::describe(&call.name, &call.input);
            lp.progress.last_tool = what.clone();
            lp.beat(&what).await;
            let remaining = lp.deadline.saturating_duration_since(Instant::now());
            let ran = lp
                .drive(sandbox.run(&call.name, &call.input, remaining), &what)
                .await;
            let out = match ran {
                Ok(o) => o?,
                Err(s) => break 'conversation Err(s),
            };
            lp.transcript.write(&json!({"type": "tool", "turn": n, "name": call.name, "id": call.id, "is_error": out.is_error}));
            if out.over_disk_limit {
                over_disk_limit = true;
                break 'conversation Ok((
                    -1,
                    "stopped: the workspace grew past the sandbox's disk limit".to_owned(),
                ));
            }
            outputs.push(ToolOutput {
                call,
                content: out.content,
                is_error: out.is_error,
            });
        }
        provider.add_tool_outputs(&outputs);
        written = write_messages(&mut lp, &provider, written, n);
        lp.transcript
            .write(&json!({"type": "checkpoint", "turn": n, "messages": written}));
    };

    let p = &lp.progress;
    // What the ledger holds is at least what was charged; never report less.
    let cost_micros = p.cost_micros.max(p.charged_micros);
    let (exit_code, timed_out, text) = match outcome {
        Ok((code, text)) => (code, false, text),
        Err(Stop::Deadline) => (-1, true, format!("agent did not finish within {timeout} s")),
        Err(Stop::Cancelled) => {
            lp.transcript
                .write(&json!({"type": "end", "reason": "cancelled", "turns": p.turns}));
            tracing::info!(run_id = %req.run_id, fork = req.fork, "agent cancelled");
            return Err(AgentError::Cancelled);
        }
    };
    lp.transcript.write(&json!({
        "type": "end", "reason": if timed_out { "timeout" } else if over_disk_limit { "disk_limit" } else if exit_code == 0 { "end_turn" } else { "turn_limit" },
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
        transcript_key: if lp.transcript.key.is_empty() {
            String::new()
        } else {
            lp.transcript.key.clone()
        },
        ..Default::default()
    })
}
