//! The `agent.run` activity on the `agent-runner` queue.

use crate::{progress::ProgressSink, runner::Runner};
use forkyard_proto::agent::v1::{AgentProgress, RunAgentRequest, RunAgentResponse};
use std::sync::Arc;
use temporalio_macros::activities;
use temporalio_sdk::activities::{ActivityContext, ActivityError};

pub struct AgentActivities {
    pub runner: Runner,
}

struct Heartbeats<'a>(&'a ActivityContext);

impl ProgressSink for Heartbeats<'_> {
    async fn report(&self, progress: AgentProgress) {
        if let Err(e) = self.0.record_heartbeat(progress).await {
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
        let sink = Heartbeats(&ctx);
        let out = self
            .runner
            .run(&req, &sink, ctx.cancelled(), resume, attempt)
            .await
            .map_err(|e| {
                tracing::warn!(run_id = %req.run_id, fork = req.fork, error = %e, "agent failed");
                e.into_activity_from(&self.runner.advertise)
            })?;
        tracing::info!(
            run_id = %req.run_id, fork = req.fork, exit_code = out.exit_code, turns = out.turns,
            cost_micros = out.cost_micros, duration_ms = out.duration_ms, "agent finished"
        );
        Ok(out)
    }
}
