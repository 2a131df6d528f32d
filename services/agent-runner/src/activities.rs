//! The `agent.run` activity on the `agent-runner` queue.

use crate::{command, error::AgentError, grpc::Provisioners};
use forkyard_proto::agent::v1::{AgentProgress, RunAgentRequest, RunAgentResponse};
use std::{sync::Arc, time::Duration};
use temporalio_macros::activities;
use temporalio_sdk::activities::{ActivityContext, ActivityError};

pub struct AgentActivities {
    pub provisioners: Provisioners,
    pub heartbeat: Duration,
}

struct Heartbeats<'a>(&'a ActivityContext);

impl command::ProgressSink for Heartbeats<'_> {
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
        let (client, endpoint) = self
            .provisioners
            .client_for(&req.sandbox_endpoint)
            .map_err(AgentError::into_activity)?;
        let sink = Heartbeats(&ctx);
        let out = command::run(
            client,
            &endpoint,
            &req,
            &sink,
            self.heartbeat,
            ctx.cancelled(),
        )
        .await
        .map_err(AgentError::into_activity)?;
        tracing::info!(
            run_id = %req.run_id, fork = req.fork, exit_code = out.exit_code,
            cost_micros = out.cost_micros, duration_ms = out.duration_ms, "agent finished"
        );
        Ok(out)
    }
}
