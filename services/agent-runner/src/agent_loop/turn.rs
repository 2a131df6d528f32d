//! The conversation's side of the loop, a turn at a time: ask the model, count and
//! charge the turn, run its tool calls in the sandbox and hand the results back.

use super::clock::{Loop, Stop};
use crate::{
    charge::{Charger, LEDGER_OUTAGE_GRACE},
    drivers::Choice,
    error::AgentError,
    llm::{Provider, ToolCall, ToolOutput, Turn},
    models::Price,
    progress::ProgressSink,
    tools::{self, Sandbox},
    transcript::Transcript,
};
use forkyard_proto::agent::v1::{AgentProgress, RunAgentRequest};
use serde_json::{Value, json};
use std::{ops::ControlFlow, time::Instant};

/// How the conversation ended, short of an error.
pub(super) enum End {
    /// The model ended its turn without tool calls: its last text.
    Answered(String),
    /// The turn limit (so many turns) was reached.
    TurnLimit(u32),
    /// A tool call left the workspace past the sandbox's disk limit.
    DiskLimit,
    Stopped(Stop),
}

/// The model, the sandbox its tools run in and the ledger its turns are charged to.
pub(super) struct Conversation<'r> {
    pub(super) req: &'r RunAgentRequest,
    pub(super) provider: Provider,
    pub(super) sandbox: Sandbox,
    pub(super) charger: Option<Charger>,
    pub(super) price: Price,
    pub(super) max_turns: u32,
    /// How many of the provider's messages the transcript holds.
    pub(super) written: usize,
    pub(super) point: PointAt,
}

/// What a branch point taken while the loop runs needs: who asks for it, and the
/// session and driver its kept conversation is under.
pub(super) struct PointAt {
    pub(super) captures: std::sync::Arc<crate::llm_gateway::capture::Captures>,
    pub(super) session: String,
    pub(super) driver: String,
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

impl Conversation<'_> {
    /// A first attempt: the transcript's first line.
    pub(super) fn start<S: ProgressSink>(&self, lp: &mut Loop<'_, S>, choice: &Choice) {
        let req = self.req;
        lp.transcript.write(&json!({
            "type": "start", "run_id": req.run_id, "fork": req.fork, "attempt": req.attempt.max(1),
            "driver": choice.driver, "model": choice.model, "max_turns": self.max_turns,
        }));
    }

    /// A branch (fork trees) goes on from its parent's conversation, kept in the
    /// parent's workspace (`kept`), with its own prompt as the next user turn.
    pub(super) async fn continue_parent<S: ProgressSink>(
        &mut self,
        lp: &mut Loop<'_, S>,
        driver: &str,
    ) -> Result<(), AgentError> {
        let Some(parents) = super::kept::parents(&mut self.sandbox, self.req, driver).await? else {
            return Ok(());
        };
        let parent_fork = self.req.branch_of.as_ref().map_or(0, |b| b.parent_fork);
        lp.transcript.write(&json!({
            "type": "branch", "parent_fork": parent_fork, "parent_messages": parents.len(),
        }));
        let messages = super::kept::continued(driver, parents, &self.req.prompt);
        self.provider.restore(messages);
        Ok(())
    }

    /// A retried attempt goes on from the failed one's last heartbeat `r` (turns, tokens,
    /// cost), and from its conversation when the transcript's `earlier` lines hold it
    /// (`true`).
    pub(super) fn resume<S: ProgressSink>(
        &mut self,
        lp: &mut Loop<'_, S>,
        r: AgentProgress,
        earlier: &[Value],
        activity_attempt: u32,
    ) -> bool {
        let restored = resumed_messages(earlier, r.turns);
        lp.transcript.write(&json!({
            "type": "resume", "activity_attempt": activity_attempt, "turns": r.turns,
            "cost_micros": r.cost_micros, "conversation_restored": restored.is_some(),
        }));
        if let Some(msgs) = restored {
            self.written = msgs.len();
            self.provider.restore(msgs);
        }
        tracing::info!(run_id = %self.req.run_id, fork = self.req.fork, turns = r.turns, restored = self.written > 0, "agent resumes from its last heartbeat");
        lp.progress = r;
        self.written > 0
    }

    /// A branch point asked of the running loop, taken before it asks its model again
    /// (`turns` turns in, their tools run): its conversation kept in the workspace as at
    /// its end, then the workspace snapshotted.
    async fn branch_point(&mut self, turns: u32) {
        if !self.point.captures.asked() {
            return;
        }
        let messages = self.provider.messages().to_vec();
        let keep = super::kept::keep(
            &mut self.sandbox,
            self.req,
            &self.point.session,
            &self.point.driver,
            &messages,
        );
        self.point.captures.take_point(turns, keep).await;
    }

    /// The provider's messages the transcript does not hold yet, written under `turn`.
    pub(super) fn write_messages(&mut self, transcript: &mut Transcript, turn: u32) {
        for m in &self.provider.messages()[self.written..] {
            transcript.write(&json!({"type": "message", "turn": turn, "message": m}));
        }
        self.written = self.provider.messages().len();
    }

    /// One turn: the model asked, the turn counted and charged, its tool calls run and
    /// their results handed back. `Break` when the conversation ends.
    pub(super) async fn turn<S: ProgressSink>(
        &mut self,
        lp: &mut Loop<'_, S>,
    ) -> Result<ControlFlow<End>, AgentError> {
        if lp.progress.turns >= self.max_turns {
            return Ok(ControlFlow::Break(End::TurnLimit(self.max_turns)));
        }
        self.branch_point(lp.progress.turns).await;
        let turn = match lp
            .drive(self.provider.next_turn(), "waiting for the model")
            .await
        {
            Ok(t) => t?,
            Err(s) => return Ok(ControlFlow::Break(End::Stopped(s))),
        };
        let (n, cost) = self.count(lp, &turn);
        self.charge(lp, n, cost).await?;
        lp.beat(&format!("turn {n} done")).await;
        if turn.calls.is_empty() {
            return Ok(ControlFlow::Break(End::Answered(turn.text)));
        }
        self.run_tools(lp, n, turn.calls).await
    }

    /// Count `turn` in the progress (tokens, cost) and the transcript: its number and
    /// what it cost.
    fn count<S: ProgressSink>(&mut self, lp: &mut Loop<'_, S>, turn: &Turn) -> (u32, i64) {
        lp.progress.turns += 1;
        let n = lp.progress.turns;
        let cost = self.price.cost_micros(&turn.usage);
        let mut usage = lp.progress.usage.unwrap_or_default();
        crate::usage_sum::add(&mut usage, &turn.usage);
        lp.progress.usage = Some(usage);
        lp.progress.cost_micros += cost;
        self.write_messages(&mut lp.transcript, n);
        lp.transcript.write(&json!({
            "type": "usage", "turn": n, "input_tokens": turn.usage.input_tokens,
            "output_tokens": turn.usage.output_tokens, "cache_read_tokens": turn.usage.cache_read_tokens,
            "cache_write_tokens": turn.usage.cache_write_tokens, "cost_micros": cost,
            "stop_reason": turn.stop_reason,
        }));
        (n, cost)
    }

    /// Charge turn `n`'s `cost` to the ledger. A ledger that does not answer defers the
    /// charge (the fork's commit posts it) for up to [`LEDGER_OUTAGE_GRACE`]; a refused
    /// charge stops the agent.
    async fn charge<S: ProgressSink>(
        &mut self,
        lp: &mut Loop<'_, S>,
        n: u32,
        cost: i64,
    ) -> Result<(), AgentError> {
        let Some(charger) = self.charger.as_mut() else {
            return Ok(());
        };
        let req = self.req;
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
            Err(e) => return Err(refused(req, lp, n, e).await),
        }
        Ok(())
    }

    /// Run turn `n`'s tool calls in the sandbox, one after another, and hand their
    /// results back to the model (a checkpoint in the transcript).
    async fn run_tools<S: ProgressSink>(
        &mut self,
        lp: &mut Loop<'_, S>,
        n: u32,
        calls: Vec<ToolCall>,
    ) -> Result<ControlFlow<End>, AgentError> {
        let mut outputs = Vec::with_capacity(calls.len());
        for call in calls {
            let what = tools::describe(&call.name, &call.input);
            lp.progress.last_tool = what.clone();
            lp.beat(&what).await;
            let remaining = lp.deadline.saturating_duration_since(Instant::now());
            let ran = lp
                .drive(self.sandbox.run(&call.name, &call.input, remaining), &what)
                .await;
            let out = match ran {
                Ok(o) => o?,
                Err(s) => return Ok(ControlFlow::Break(End::Stopped(s))),
            };
            lp.transcript.write(&json!({"type": "tool", "turn": n, "name": call.name, "id": call.id, "is_error": out.is_error}));
            if out.over_disk_limit {
                return Ok(ControlFlow::Break(End::DiskLimit));
            }
            outputs.push(ToolOutput {
                call,
                content: out.content,
                is_error: out.is_error,
            });
        }
        self.provider.add_tool_outputs(&outputs);
        self.write_messages(&mut lp.transcript, n);
        lp.transcript
            .write(&json!({"type": "checkpoint", "turn": n, "messages": self.written}));
        Ok(ControlFlow::Continue(()))
    }
}

/// The ledger refused turn `n`'s charge (`e`): the agent stops there.
async fn refused<S: ProgressSink>(
    req: &RunAgentRequest,
    lp: &mut Loop<'_, S>,
    n: u32,
    e: AgentError,
) -> AgentError {
    lp.transcript.write(
        &json!({"type": "end", "reason": "charge refused", "error": e.to_string(), "turns": n}),
    );
    tracing::warn!(run_id = %req.run_id, fork = req.fork, turn = n, error = %e, "charge refused, stopping the agent");
    lp.beat("stopped: charge refused").await;
    // The fork's error then says how far the agent got.
    match e {
        AgentError::BudgetExceeded(m) => AgentError::BudgetExceeded(format!(
            "{m}; the agent stopped after {} turns ({} micro-USD charged, turn {n} not)",
            n - 1,
            lp.progress.charged_micros
        )),
        other => other,
    }
}
