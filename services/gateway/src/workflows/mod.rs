//! The run's workflows, hosted by the gateway's worker on `forkyard-orchestration`.
//!
//! They only orchestrate: every side effect is an activity on the owning service's
//! task queue, called through the shared contracts in `forkyard_proto::activities`.
//! Workflow code is deterministic: time comes from `ctx.workflow_time()`, never a clock.

pub mod branching;
pub mod cleanup;
pub(crate) mod deliver;
mod failure;
pub mod fork;
mod fork_result;
mod fork_results;
mod history;
mod inline;
mod input;
mod join;
mod options;
pub mod orchestration;
mod patches;
pub mod phase;
mod placement;
mod prepare;
mod rounds;
mod run_loop;
mod run_state;
mod search_state;
mod settle;
mod start;
mod steps;

pub use deliver::PublishWorkflow;
pub use fork::ForkWorkflow;
pub use fork_results::fork_results;
pub use input::{AgentEnd, BranchFrom, ForkInput, Handoff};
pub use run_state::{SandboxOrchestrationWorkflow, outcome};

use temporalio_common::search_attributes::SearchAttributeKey;

/// Search attributes the run workflow keeps (registered by the gateway at start):
/// its live state (RUNNING / PAUSED / AWAITING_BUDGET) and its labels as `key=value`.
pub const RUN_STATE_ATTR: SearchAttributeKey<String> =
    SearchAttributeKey::keyword("ForkyardRunState");
pub const LABELS_ATTR: SearchAttributeKey<Vec<String>> =
    SearchAttributeKey::keyword_list("ForkyardLabels");

/// Workflow type names; part of the persisted history, never rename.
pub const ORCHESTRATION_WORKFLOW: &str = "SandboxOrchestrationWorkflow";
pub const FORK_WORKFLOW: &str = "ForkWorkflow";
pub const CLEANUP_WORKFLOW: &str = "ScheduledCleanupWorkflow";
