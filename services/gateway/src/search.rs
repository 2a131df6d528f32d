//! The search attributes runs are listed by, and the visibility queries over them (that
//! they exist before the gateway serves: `crate::search_attributes`).

use crate::{
    error::GatewayError,
    workflows::{LABELS_ATTR, ORCHESTRATION_WORKFLOW, RUN_STATE_ATTR},
};
use forkyard_proto::gateway::v1::RunState;
use std::collections::HashMap;
use temporalio_common::search_attributes::SearchAttributeKey;

/// The tenant that launched the run (set at start; never changes).
pub const TENANT_ATTR: SearchAttributeKey<String> = SearchAttributeKey::keyword("ForkyardTenant");
/// The run's `max_concurrent` (its most forks in flight), summed per tenant at launch to
/// hold the tenant's concurrent-forks limit.
pub const FORK_SLOTS_ATTR: SearchAttributeKey<i64> = SearchAttributeKey::int("ForkyardForkSlots");

/// The visibility query for ListRuns' filters.
pub fn list_query(
    state: RunState,
    labels: &HashMap<String, String>,
) -> Result<String, GatewayError> {
    list_query_for(None, state, labels)
}

/// `list_query` over one tenant's runs (`None`: every run, as without authentication).
/// Tenant names are `[a-z0-9-]` (checked when their key was made), so they need no quoting.
pub fn list_query_for(
    tenant: Option<&str>,
    state: RunState,
    labels: &HashMap<String, String>,
) -> Result<String, GatewayError> {
    let mut q = format!("WorkflowType = '{ORCHESTRATION_WORKFLOW}'");
    if let Some(t) = tenant {
        if t.contains(['\'', '\\']) {
            return Err(GatewayError::Internal(format!(
                "tenant name {t:?} is not query-safe"
            )));
        }
        q.push_str(&format!(" AND {} = '{t}'", TENANT_ATTR.name()));
    }
    let live = |s: &str| {
        format!(
            " AND ExecutionStatus = 'Running' AND {} = '{s}'",
            RUN_STATE_ATTR.name()
        )
    };
    q.push_str(&match state {
        RunState::Unspecified => String::new(),
        RunState::Running | RunState::Paused | RunState::AwaitingBudget => {
            live(state.as_str_name())
        }
        // A run whose workflow completed with no fork succeeded is FAILED (it says so in
        // its run-state attribute since this build; earlier ones stay COMPLETED).
        RunState::Completed => format!(
            " AND ExecutionStatus = 'Completed' AND {} != 'RUN_STATE_FAILED'",
            RUN_STATE_ATTR.name()
        ),
        RunState::Failed => format!(
            " AND (ExecutionStatus = 'Failed' OR (ExecutionStatus = 'Completed' AND {} = 'RUN_STATE_FAILED'))",
            RUN_STATE_ATTR.name()
        ),
        RunState::Cancelled => " AND ExecutionStatus = 'Canceled'".into(),
        RunState::Terminated => " AND ExecutionStatus = 'Terminated'".into(),
        RunState::TimedOut => " AND ExecutionStatus = 'TimedOut'".into(),
    });
    let mut sorted: Vec<_> = labels.iter().collect();
    sorted.sort();
    for (k, v) in sorted {
        // Label values were checked at launch to hold no quote; refuse them here too.
        if k.contains(['\'', '\\']) || v.contains(['\'', '\\']) {
            return Err(GatewayError::field(
                "labels",
                format!("label {k:?} cannot hold quotes or backslashes"),
            ));
        }
        q.push_str(&format!(" AND {} = '{k}={v}'", LABELS_ATTR.name()));
    }
    Ok(q)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_become_visibility_queries() {
        let q = list_query(
            RunState::Paused,
            &HashMap::from([("team".into(), "infra".into())]),
        )
        .unwrap();
        assert_eq!(
            q,
            "WorkflowType = 'SandboxOrchestrationWorkflow' AND ExecutionStatus = 'Running' AND \
             ForkyardRunState = 'RUN_STATE_PAUSED' AND ForkyardLabels = 'team=infra'"
        );
        let q = list_query(RunState::Cancelled, &HashMap::new()).unwrap();
        assert!(q.ends_with("ExecutionStatus = 'Canceled'"), "{q}");
        assert!(
            list_query(
                RunState::Unspecified,
                &HashMap::from([("a".into(), "x' OR 1=1".into())])
            )
            .is_err()
        );
    }
}
