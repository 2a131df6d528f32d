//! A run's state as the API tells it, from its workflow execution's status.

use forkyard_proto::gateway::v1::RunState;
use temporalio_client::WorkflowExecutionStatus;

/// The API state of a closed (or running) workflow execution.
pub fn run_state(s: WorkflowExecutionStatus) -> RunState {
    match s {
        WorkflowExecutionStatus::Running | WorkflowExecutionStatus::Paused => RunState::Running,
        WorkflowExecutionStatus::Completed | WorkflowExecutionStatus::ContinuedAsNew => {
            RunState::Completed
        }
        WorkflowExecutionStatus::Failed => RunState::Failed,
        WorkflowExecutionStatus::Canceled => RunState::Cancelled,
        WorkflowExecutionStatus::Terminated => RunState::Terminated,
        WorkflowExecutionStatus::TimedOut => RunState::TimedOut,
        _ => RunState::Unspecified,
    }
}
