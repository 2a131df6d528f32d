//! What a fork's steps start from and hand on: its input (the payload of its child
//! workflow, and what an inline fork's steps read), how its agent ended, and what the
//! steps spent so far. The serde types are part of persisted histories: fields are only
//! ever added.

use forkyard_proto::{common::v1::ForkResult, gateway::v1::RunSpec, sandbox::v1::Sandbox};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct ForkInput {
    pub run_id: String,
    pub fork: u32,
    /// 1 for the first start; a fork that waited for budget starts again as attempt 2, …
    /// (idempotency keys include it, so the new attempt is not a replay of the old).
    pub attempt: u32,
    pub spec: RunSpec,
    /// What this fork may spend, reserved in the run's ledger account before it starts.
    pub reservation_micros: i64,
    /// The reservation the run made for this fork; the agent charges it, the child
    /// settles it.
    pub reservation_id: String,
    /// The fork's sandbox, made and health-checked by the run.
    pub sandbox: Option<Sandbox>,
    pub started_unix_ms: i64,
    pub sandbox_ready_unix_ms: i64,
    /// Set when the run ran the agent (and verify) itself and the patch was too large
    /// for its history: the child goes on from the patch.
    pub handoff: Option<Handoff>,
    /// Set for a branch of another fork (BranchFork): where it starts.
    pub branch: Option<BranchFrom>,
}

/// A branched fork's branch point: its parent's workspace (a snapshot at the replica
/// holding it) and agent session at the parent's end, and the next user turn.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct BranchFrom {
    pub parent_fork: u32,
    /// The parent's depth + 1.
    pub depth: u32,
    pub snapshot_id: String,
    /// The provisioner replica holding the snapshot (the parent sandbox's owner; empty:
    /// the create address).
    pub snapshot_endpoint: String,
    /// The parent's agent session (claude-code), empty when it had none.
    pub session: String,
    /// The branch's prompt; empty: the run's prompt again.
    pub prompt: String,
    /// The parent's model responses before a point captured while it ran; 0: its end
    /// (left out then: such inputs read as before).
    #[serde(skip_serializing_if = "is_zero")]
    pub turn: u32,
}

impl ForkInput {
    /// What the fork's agent is asked: its branch's prompt, else the run's.
    pub fn prompt(&self) -> &str {
        match &self.branch {
            Some(b) if !b.prompt.trim().is_empty() => &b.prompt,
            _ => &self.spec.prompt,
        }
    }
}

/// What a run hands to the child of an inline fork whose patch it cannot keep.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Handoff {
    /// The fork so far (agent and verify results, no patch).
    pub result: ForkResult,
    pub agent: AgentEnd,
    pub cost_micros: i64,
    pub sandbox_charged_micros: i64,
}

/// How the agent ended, for the fork's status once its patch is in.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct AgentEnd {
    pub timed_out: bool,
    pub exit_code: i32,
    /// Stopped because the workspace grew past the sandbox's disk limit.
    pub over_disk_limit: bool,
}

impl AgentEnd {
    /// The agent did its work: it exited 0 in time, within the sandbox's disk limit (the
    /// fork then succeeds once its patch is in).
    pub fn succeeded(&self) -> bool {
        !self.timed_out && !self.over_disk_limit && self.exit_code == 0
    }
}

/// What the work steps produced before they stopped.
#[derive(Default)]
pub(super) struct Progress {
    /// What the agent spent: its model usage and the sandbox time it charged.
    pub(super) cost_micros: i64,
    /// Of `cost_micros`, the sandbox's part charged while the agent ran.
    pub(super) sandbox_charged_micros: i64,
    /// The agent charges its model turns to this reservation as it goes.
    pub(super) reservation_id: String,
}

/// The idempotency key of a fork's step: `<run>/fork-<n>/a<attempt>/<step>` (the same
/// keys whichever workflow runs the step, so a retried step never applies twice).
pub(super) fn step_key(child_id: &str, attempt: u32, step: &str) -> String {
    format!("{child_id}/a{}/{step}", attempt.max(1))
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}
