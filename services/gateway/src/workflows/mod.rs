//! The run's workflows, hosted by the gateway's worker on `forkyard-orchestration`.
//!
//! They only orchestrate: every side effect is an activity on the owning service's
//! task queue, called through the shared contracts in `forkyard_proto::activities`.
//! Workflow code is deterministic: time comes from `ctx.workflow_time()`, never a clock.

mod failure;
pub mod fork;
mod options;
pub mod orchestration;

pub use fork::{ForkInput, ForkWorkflow};
pub use orchestration::SandboxOrchestrationWorkflow;

/// Workflow type names; part of the persisted history, never rename.
pub const ORCHESTRATION_WORKFLOW: &str = "SandboxOrchestrationWorkflow";
pub const FORK_WORKFLOW: &str = "ForkWorkflow";

fn unix_ms(t: Option<std::time::SystemTime>) -> i64 {
    t.and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or_default()
}
