//! Who answers "is this workflow still running": Temporal (or a fake in tests).

use crate::{classify::WorkflowState, error::JanitorError};
use std::future::Future;
use temporalio_client::{
    Client, UntypedWorkflow, WorkflowDescribeOptions, WorkflowExecutionStatus,
    errors::WorkflowInteractionError,
};

/// Who answers "is this workflow still running": Temporal, or a fake in tests.
pub trait Workflows: Send + Sync + 'static {
    fn state(
        &self,
        workflow_id: &str,
    ) -> impl Future<Output = Result<WorkflowState, JanitorError>> + Send;
}

impl Workflows for Client {
    async fn state(&self, workflow_id: &str) -> Result<WorkflowState, JanitorError> {
        let handle = self.get_workflow_handle::<UntypedWorkflow>(workflow_id);
        match handle.describe(WorkflowDescribeOptions::default()).await {
            Ok(desc) => {
                let state = workflow_state(desc.status());
                if state != WorkflowState::Running {
                    return Ok(state);
                }
                Ok(agent_silence_secs(&desc.raw_description).map_or(state, WorkflowState::Silent))
            }
            Err(WorkflowInteractionError::NotFound(_)) => Ok(WorkflowState::NotFound),
            Err(e) => Err(JanitorError::Temporal(format!(
                "describe workflow {workflow_id:?}: {e}"
            ))),
        }
    }
}

/// How long the workflow's started agent activity has gone without a heartbeat (since
/// its last heartbeat, or its start if none), if one is running.
fn agent_silence_secs(
    desc: &temporalio_common::protos::temporal::api::workflowservice::v1::DescribeWorkflowExecutionResponse,
) -> Option<u64> {
    use temporalio_common::protos::temporal::api::enums::v1::PendingActivityState;
    let now = std::time::SystemTime::now();
    desc.pending_activities
        .iter()
        .filter(|a| {
            a.activity_type
                .as_ref()
                .is_some_and(|t| t.name == "agent.run")
        })
        .filter(|a| a.state == PendingActivityState::Started as i32)
        .filter_map(|a| {
            let last = a.last_heartbeat_time.or(a.last_started_time)?;
            let last = std::time::UNIX_EPOCH
                + std::time::Duration::new(
                    u64::try_from(last.seconds).ok()?,
                    u32::try_from(last.nanos).ok()?,
                );
            now.duration_since(last).ok().map(|d| d.as_secs())
        })
        .max()
}

/// Temporal's status as the janitor sees it; names as in Temporal's API.
pub fn workflow_state(status: WorkflowExecutionStatus) -> WorkflowState {
    use WorkflowExecutionStatus as S;
    let closed = |name: &str| WorkflowState::Closed(name.to_owned());
    match status {
        S::Running | S::Paused => WorkflowState::Running,
        S::Completed => closed("COMPLETED"),
        S::Failed => closed("FAILED"),
        S::Canceled => closed("CANCELED"),
        S::Terminated => closed("TERMINATED"),
        S::ContinuedAsNew => closed("CONTINUED_AS_NEW"),
        S::TimedOut => closed("TIMED_OUT"),
        // Unspecified, Unknown and statuses newer than this code: never destroy.
        _ => WorkflowState::Unknown,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use WorkflowExecutionStatus as S;

    #[test]
    fn temporal_status_table() {
        let closed = |s: &str| WorkflowState::Closed(s.to_owned());
        let cases = [
            (S::Running, WorkflowState::Running),
            (S::Paused, WorkflowState::Running),
            (S::Completed, closed("COMPLETED")),
            (S::Failed, closed("FAILED")),
            (S::Canceled, closed("CANCELED")),
            (S::Terminated, closed("TERMINATED")),
            (S::ContinuedAsNew, closed("CONTINUED_AS_NEW")),
            (S::TimedOut, closed("TIMED_OUT")),
            (S::Unspecified, WorkflowState::Unknown),
            (S::Unknown, WorkflowState::Unknown),
        ];
        for (status, want) in cases {
            assert_eq!(workflow_state(status), want, "{status:?}");
        }
    }
}
