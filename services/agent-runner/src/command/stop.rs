//! How a command's agent is stopped before it exits: its budget spent, or the ledger
//! away past the grace. (Cancellation is the caller's, see `Running::cancel`.)

use crate::{
    command_meter::{Meter, add_totals},
    error::AgentError,
    llm_gateway::grants::GrantHandle,
    progress::ProgressSink,
};
use serde_json::json;
use std::time::Duration;

/// How long the end of a command waits for its last requests' charges.
pub(super) const SETTLE: Duration = Duration::from_secs(15);

/// The agent's charges have not reached the ledger for too long: it is stopped, and the
/// attempt is retried (what it used is in its last beat, for the fork's commit).
pub(super) async fn ledger_away<S: ProgressSink>(
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
pub(super) async fn spent<S: ProgressSink>(
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
