//! A running fork's branch point (#45): its last completed model turn. The runner
//! replica running the fork's agent (named in the agent's heartbeat) holds the fork's
//! next model request at its LLM gateway while the workspace is snapshotted, then lets
//! it go (the built-in loops keep their conversation in the workspace and have it
//! snapshotted before they ask their model again); the fork never stops. The point then travels in the `branch_fork` update, so
//! the branches start from it as from a finished fork's end.

use super::GatewayService;
use crate::{error::GatewayError, workflows::branching::BranchPoint};
use forkyard_proto::{Driver, gateway::v1::Run};
use std::time::Duration;

/// Of the call's deadline, what the snapshot and the update after the point are left.
const AFTER_THE_POINT: Duration = Duration::from_secs(10);

impl GatewayService {
    /// How long a runner waits for the fork's next model request: the call's deadline
    /// (`--call-deadline-secs`) but what the snapshot and the update need after it.
    fn capture_wait(&self) -> Duration {
        self.deadline
            .saturating_sub(AFTER_THE_POINT)
            .max(Duration::from_secs(1))
    }

    /// Capture fork `fork` of `run` (running; `run_id`'s) at its next model request.
    pub(super) async fn capture_point(
        &self,
        run_id: &str,
        run: &Run,
        fork: u32,
    ) -> Result<BranchPoint, GatewayError> {
        let spec = run.spec.clone().unwrap_or_default();
        let driver = spec.agent.as_ref().map_or("", |a| a.driver.as_str());
        let Some(link) = &self.agent_runner else {
            return Err(GatewayError::FailedPrecondition(
                "this gateway has no agent runner to capture a running fork's branch point".into(),
            ));
        };
        let beat = if spec.inline_forks {
            self.inline_agents(run_id).await.remove(&fork)
        } else {
            self.fork_live(run_id, fork).await.and_then(|(_, p)| p)
        };
        let endpoint = beat.map(|p| p.runner_endpoint).unwrap_or_default();
        let p = link
            .capture(run_id, fork, &endpoint, self.capture_wait())
            .await?;
        let resumes = Driver::parse(driver).is_some_and(|d| d.capabilities().resumable);
        if resumes && p.session.is_empty() {
            // Its snapshot goes with the run (the janitor's sweep of ended runs' snapshots).
            return Err(GatewayError::FailedPrecondition(format!(
                "fork {fork}'s agent has printed no session id yet: a branch would not continue its conversation"
            )));
        }
        tracing::info!(run_id, fork, turn = p.turn, snapshot_id = %p.snapshot_id, "running fork's branch point captured");
        Ok(BranchPoint {
            snapshot_id: p.snapshot_id,
            snapshot_endpoint: p.snapshot_endpoint,
            session: p.session,
            turn: p.turn,
        })
    }
}
