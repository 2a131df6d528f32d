//! `CaptureBranchPoint`: a running fork's branch point, taken at its next model request:
//! by this replica's LLM gateway for agents in the sandbox (`llm_gateway::capture`),
//! which holds the request while the workspace is snapshotted; by the built-in loop
//! itself before it asks its model again, its conversation first kept in the workspace.
//! The gateway asks the replica named in the fork's heartbeat
//! (`AgentProgress.runner_endpoint`).

use crate::{error::AgentError, runner::Runner};
use forkyard_proto::agent::v1::{CaptureBranchPointRequest, CaptureBranchPointResponse};
use std::time::Duration;
use tonic::Code;

/// How long a capture waits for the fork's next model request unless asked otherwise.
pub const DEFAULT_WAIT: Duration = Duration::from_secs(120);
/// The longest wait a caller may ask for.
const MAX_WAIT_SECS: u32 = 600;

/// Wait for `req.fork`'s next model request and snapshot its workspace there.
pub async fn capture(
    runner: &Runner,
    req: &CaptureBranchPointRequest,
) -> Result<CaptureBranchPointResponse, AgentError> {
    if req.run_id.is_empty() {
        return Err(AgentError::InvalidArgument("run_id: is empty".into()));
    }
    if req.wait_secs > MAX_WAIT_SECS {
        return Err(AgentError::InvalidArgument(format!(
            "wait_secs: {} is more than {MAX_WAIT_SECS}",
            req.wait_secs
        )));
    }
    let wait = match req.wait_secs {
        0 => DEFAULT_WAIT,
        s => Duration::from_secs(u64::from(s)),
    };
    let fail = |code, message: String| AgentError::BranchPoint { code, message };
    let grant = runner
        .llm_gateway
        .as_ref()
        .and_then(|gw| gw.grants.of_fork(&req.run_id, req.fork));
    let asked = match (grant, runner.loops.get(&req.run_id, req.fork)) {
        // The grant is the agent's: it is not held past the asking.
        (Some(grant), _) => grant.captures.ask()?,
        (None, Some(captures)) => captures.ask()?,
        (None, None) => {
            return Err(fail(
                Code::NotFound,
                format!("no agent of fork {} runs on this replica", req.fork),
            ));
        }
    };
    match tokio::time::timeout(wait, asked).await {
        Ok(Ok(Ok(p))) => Ok(CaptureBranchPointResponse {
            snapshot_id: p.snapshot_id,
            snapshot_endpoint: p.snapshot_endpoint,
            session: p.session,
            turn: p.turn,
        }),
        Ok(Ok(Err(why))) => Err(fail(Code::Unavailable, why)),
        Ok(Err(_)) => Err(fail(
            Code::FailedPrecondition,
            format!(
                "the agent of fork {} ended before its next model request; branch the fork from its end",
                req.fork
            ),
        )),
        Err(_) => Err(fail(
            Code::DeadlineExceeded,
            format!(
                "fork {} asked its model nothing in {} s (a long tool call, or an agent that does not use the gateway); try again, or branch it from its end",
                req.fork,
                wait.as_secs()
            ),
        )),
    }
}
