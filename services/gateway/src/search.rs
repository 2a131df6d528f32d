//! The search attributes runs are listed by, and the visibility queries over them.

use crate::{
    error::GatewayError,
    workflows::{LABELS_ATTR, ORCHESTRATION_WORKFLOW, RUN_STATE_ATTR},
};
use forkyard_proto::gateway::v1::RunState;
use std::collections::HashMap;
use temporalio_client::Client;
use temporalio_common::protos::temporal::api::{
    enums::v1::IndexedValueType,
    operatorservice::v1::{AddSearchAttributesRequest, ListSearchAttributesRequest},
};
use temporalio_common::search_attributes::SearchAttributeKey;

/// The tenant that launched the run (set at start; never changes).
pub const TENANT_ATTR: SearchAttributeKey<String> = SearchAttributeKey::keyword("ForkyardTenant");
/// The run's `max_concurrent` (its most forks in flight), summed per tenant at launch to
/// hold the tenant's concurrent-forks limit.
pub const FORK_SLOTS_ATTR: SearchAttributeKey<i64> = SearchAttributeKey::int("ForkyardForkSlots");

/// Make sure the custom search attributes exist in the namespace (the run workflow
/// upserts them; an unknown attribute would fail its workflow tasks). On Temporal
/// Cloud, where the operator API is closed, create them beforehand and this only checks.
///
/// Gateway replicas start together and race to add them, and a Temporal that has just
/// come up can fail a call it answers a moment later: such a failure is retried with
/// backoff (each retry looks again first), for as long as it takes, as a connection is.
/// Only a refusal that no retry can change (the operator API closed or denied) ends it.
pub async fn ensure_registered(client: &Client, namespace: &str) -> Result<(), String> {
    let mut delay = std::time::Duration::from_millis(200);
    let mut attempt = 0u32;
    loop {
        attempt += 1;
        match register_missing(client, namespace).await {
            Ok(()) => return Ok(()),
            Err((code, e)) if is_permanent(code) => return Err(e),
            Err((_, e)) => {
                tracing::warn!(attempt, error = %e, "search attributes not registered yet; retrying");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(std::time::Duration::from_secs(5));
            }
        }
    }
}

fn is_permanent(code: tonic::Code) -> bool {
    matches!(
        code,
        tonic::Code::PermissionDenied
            | tonic::Code::Unauthenticated
            | tonic::Code::Unimplemented
            | tonic::Code::InvalidArgument
    )
}

async fn register_missing(client: &Client, namespace: &str) -> Result<(), (tonic::Code, String)> {
    let wanted = [
        (RUN_STATE_ATTR.name(), IndexedValueType::Keyword),
        (LABELS_ATTR.name(), IndexedValueType::KeywordList),
        (TENANT_ATTR.name(), IndexedValueType::Keyword),
        (FORK_SLOTS_ATTR.name(), IndexedValueType::Int),
    ];
    let mut ops = client.connection().operator_service();
    let existing = ops
        .list_search_attributes(tonic::Request::new(ListSearchAttributesRequest {
            namespace: namespace.to_owned(),
        }))
        .await
        .map_err(|s| {
            let e = format!(
                "cannot list search attributes of namespace {namespace:?}: {}",
                s.message()
            );
            (s.code(), e)
        })?
        .into_inner();
    let missing: HashMap<String, i32> = wanted
        .iter()
        .filter(|(name, _)| !existing.custom_attributes.contains_key(*name))
        .map(|(name, ty)| ((*name).to_owned(), *ty as i32))
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    let names: Vec<String> = missing.keys().cloned().collect();
    match ops
        .add_search_attributes(tonic::Request::new(AddSearchAttributesRequest {
            search_attributes: missing,
            namespace: namespace.to_owned(),
        }))
        .await
    {
        Ok(_) => {
            tracing::info!(?names, namespace, "registered search attributes");
            Ok(())
        }
        Err(s) if s.code() == tonic::Code::AlreadyExists => Ok(()),
        Err(s) => Err((
            s.code(),
            format!(
                "search attributes {names:?} are missing in namespace {namespace:?} and cannot be added ({}); create them \
             (ForkyardRunState: Keyword, ForkyardLabels: KeywordList, ForkyardTenant: Keyword, ForkyardForkSlots: Int) and restart",
                s.message()
            ),
        )),
    }
}

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
