//! The `agent.run` activity on the `agent-runner` queue.

use crate::{progress::ProgressSink, runner::Runner};
use forkyard_proto::agent::v1::{AgentProgress, RunAgentRequest, RunAgentResponse};
use std::sync::Arc;
use temporalio_macros::activities;
use temporalio_sdk::activities::{ActivityContext, ActivityError};

pub struct AgentActivities {
    pub runner: Runner,
}

/// Attempts an agent may end in a failure of its own (the seed's table: 2). An attempt
/// whose runner was lost (killed, its heartbeats stopped) spends none of them: the
/// gateway gives the activity more attempts for that (`workflows::options::agent`), and
/// the count of the agent's own failures travels in the heartbeat
/// (`AgentProgress.failed_attempts`), which the SDK hands to the next attempt also when
/// the attempt failed right after recording it.
pub const OWN_ATTEMPTS: u32 = 2;

/// The attempt's heartbeats, the last one kept (a failure's heartbeat builds on it).
struct Heartbeats<'a> {
    ctx: &'a ActivityContext,
    last: std::sync::Mutex<Option<AgentProgress>>,
    /// This replica's endpoint, in every beat: where the gateway asks for a branch point
    /// of the running fork (`CaptureBranchPoint`).
    advertise: &'a str,
}

impl ProgressSink for Heartbeats<'_> {
    async fn report(&self, mut progress: AgentProgress) {
        self.advertise.clone_into(&mut progress.runner_endpoint);
        *self
            .last
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(progress.clone());
        if let Err(e) = self.ctx.record_heartbeat(progress).await {
            tracing::warn!(error = %e, "heartbeat not recorded");
        }
    }
}

#[activities]
impl AgentActivities {
    #[activity(definition = forkyard_proto::activities::markers::agent::Run)]
    pub async fn run(
        self: Arc<Self>,
        ctx: ActivityContext,
        req: RunAgentRequest,
    ) -> Result<RunAgentResponse, ActivityError> {
        let attempt = ctx.info().attempt;
        // A retried attempt carries the failed attempt's last heartbeat: what it already
        // did and charged.
        let resume = if attempt > 1 {
            ctx.heartbeat_details()
                .deserialize::<AgentProgress>()
                .unwrap_or_else(|e| {
                    tracing::warn!(error = %e, "unreadable heartbeat details; starting afresh");
                    None
                })
        } else {
            None
        };
        let failed_before = resume.as_ref().map_or(0, |p| p.failed_attempts);
        let sink = Heartbeats {
            ctx: &ctx,
            last: std::sync::Mutex::new(resume.clone()),
            advertise: &self.runner.advertise,
        };
        let ran = self
            .runner
            .run(&req, &sink, ctx.cancelled(), resume, attempt)
            .await;
        let out = match ran {
            Ok(out) => out,
            Err(e) => {
                tracing::warn!(run_id = %req.run_id, fork = req.fork, error = %e, "agent failed");
                let spent = e.retryable() && own_failure(&sink, failed_before).await;
                return Err(e.into_activity_with(&self.runner.advertise, spent));
            }
        };
        tracing::info!(
            run_id = %req.run_id, fork = req.fork, exit_code = out.exit_code, turns = out.turns,
            cost_micros = out.cost_micros, duration_ms = out.duration_ms, "agent finished"
        );
        Ok(out)
    }
}

/// Count a failure of the agent's own in the attempt's last heartbeat (the next attempt
/// reads it); whether that spent the agent's [`OWN_ATTEMPTS`].
async fn own_failure(sink: &Heartbeats<'_>, failed_before: u32) -> bool {
    let failed = failed_before + 1;
    let mut progress = sink
        .last
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone()
        .unwrap_or_default();
    progress.failed_attempts = failed;
    if let Err(e) = sink.ctx.record_heartbeat(progress).await {
        tracing::warn!(error = %e, "heartbeat not recorded");
    }
    failed >= OWN_ATTEMPTS
}
