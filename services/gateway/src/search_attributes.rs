//! The custom search attributes runs are listed by, present before the gateway serves:
//! the run workflow upserts them, and an attribute the namespace lacks would fail its
//! workflow tasks.
//!
//! A self-hosted Temporal lets the gateway add what is missing (the operator API). Temporal
//! Cloud does not (attributes are added with `tcld` or the Cloud UI), and some operators
//! forbid it elsewhere (`--register-search-attributes=false`). Then the gateway does not
//! exit: it serves NOT_SERVING, says which attributes are missing and the command that
//! creates them, and looks again every few seconds, serving as soon as they exist.

use crate::{
    search::{FORK_SLOTS_ATTR, TENANT_ATTR},
    workflows::{LABELS_ATTR, RUN_STATE_ATTR},
};
use std::{collections::HashMap, time::Duration};
use temporalio_client::Client;
use temporalio_common::protos::temporal::api::{
    enums::v1::IndexedValueType,
    operatorservice::v1::{AddSearchAttributesRequest, ListSearchAttributesRequest},
};

/// How often a gateway waiting for attributes looks again.
const LOOK_AGAIN: Duration = Duration::from_secs(3);
/// How often it says again what is missing.
const SAY_AGAIN: Duration = Duration::from_secs(60);

/// Every attribute the gateway needs, with its type.
fn wanted() -> [(&'static str, IndexedValueType); 4] {
    [
        (RUN_STATE_ATTR.name(), IndexedValueType::Keyword),
        (LABELS_ATTR.name(), IndexedValueType::KeywordList),
        (TENANT_ATTR.name(), IndexedValueType::Keyword),
        (FORK_SLOTS_ATTR.name(), IndexedValueType::Int),
    ]
}

/// Returns once every attribute exists in `namespace`, adding the missing ones first when
/// `register` allows and the server lets it. Transient failures (a Temporal that has just
/// come up, replicas racing to add them) are looked at again, as is a refusal.
pub async fn wait_registered(client: &Client, namespace: &str, register: bool) {
    let mut may_add = register;
    let mut said: Option<tokio::time::Instant> = None;
    // Every gateway replica waits for the same namespace: jittered, up to LOOK_AGAIN.
    let mut waits =
        forkyard_common::backoff::doubling(Duration::from_millis(500), Some(LOOK_AGAIN));
    loop {
        let missing = match missing(client, namespace).await {
            Ok(m) if m.is_empty() => return,
            Ok(m) => m,
            Err(e) => {
                tracing::warn!(namespace, error = %e, "cannot list search attributes; looking again");
                tokio::time::sleep(waits.next().unwrap_or(LOOK_AGAIN)).await;
                continue;
            }
        };
        let refusal = if may_add {
            match add(client, namespace, &missing).await {
                Ok(()) => continue,
                Err((code, e)) => {
                    // The operator API closed or denied: no retry changes that.
                    may_add = !matches!(
                        code,
                        tonic::Code::PermissionDenied
                            | tonic::Code::Unauthenticated
                            | tonic::Code::Unimplemented
                    );
                    Some(e)
                }
            }
        } else {
            None
        };
        if said.is_none_or(|t| t.elapsed() >= SAY_AGAIN) {
            let names: Vec<&str> = missing.iter().map(|(n, _)| *n).collect();
            tracing::error!(
                namespace,
                missing = ?names,
                refused = refusal.as_deref().unwrap_or("not asked: --register-search-attributes=false"),
                create = %commands(namespace, &missing),
                "search attributes missing: not serving until they exist"
            );
            said = Some(tokio::time::Instant::now());
        }
        tokio::time::sleep(waits.next().unwrap_or(LOOK_AGAIN)).await;
    }
}

/// The attributes `namespace` lacks.
async fn missing(
    client: &Client,
    namespace: &str,
) -> Result<Vec<(&'static str, IndexedValueType)>, String> {
    let existing = client
        .connection()
        .operator_service()
        .list_search_attributes(tonic::Request::new(ListSearchAttributesRequest {
            namespace: namespace.to_owned(),
        }))
        .await
        .map_err(|s| format!("{:?}: {}", s.code(), s.message()))?
        .into_inner();
    Ok(wanted()
        .into_iter()
        .filter(|(name, _)| !existing.custom_attributes.contains_key(*name))
        .collect())
}

async fn add(
    client: &Client,
    namespace: &str,
    missing: &[(&'static str, IndexedValueType)],
) -> Result<(), (tonic::Code, String)> {
    let attrs: HashMap<String, i32> = missing
        .iter()
        .map(|(name, ty)| ((*name).to_owned(), *ty as i32))
        .collect();
    let names: Vec<&str> = missing.iter().map(|(n, _)| *n).collect();
    match client
        .connection()
        .operator_service()
        .add_search_attributes(tonic::Request::new(AddSearchAttributesRequest {
            search_attributes: attrs,
            namespace: namespace.to_owned(),
        }))
        .await
    {
        Ok(_) => {
            tracing::info!(?names, namespace, "registered search attributes");
            Ok(())
        }
        // Another replica was first.
        Err(s) if s.code() == tonic::Code::AlreadyExists => Ok(()),
        Err(s) => Err((s.code(), format!("{:?}: {}", s.code(), s.message()))),
    }
}

/// The commands that create `missing`: on Temporal Cloud, and on a self-hosted cluster.
pub fn commands(namespace: &str, missing: &[(&str, IndexedValueType)]) -> String {
    let ty = |t: &IndexedValueType| match t {
        IndexedValueType::KeywordList => "KeywordList",
        IndexedValueType::Int => "Int",
        _ => "Keyword",
    };
    let cloud: Vec<String> = missing
        .iter()
        .map(|(n, t)| format!("--search-attribute {n}={}", ty(t)))
        .collect();
    let cli: Vec<String> = missing
        .iter()
        .map(|(n, t)| format!("--name {n} --type {}", ty(t)))
        .collect();
    format!(
        "Temporal Cloud: tcld namespace search-attributes add --namespace {namespace} {}; \
         self-hosted: temporal operator search-attribute create --namespace {namespace} {}",
        cloud.join(" "),
        cli.join(" ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_commands_name_each_missing_attribute_with_its_type() {
        let c = commands(
            "prod.acct",
            &[
                ("ForkyardLabels", IndexedValueType::KeywordList),
                ("ForkyardForkSlots", IndexedValueType::Int),
            ],
        );
        assert!(c.contains("tcld namespace search-attributes add --namespace prod.acct --search-attribute ForkyardLabels=KeywordList --search-attribute ForkyardForkSlots=Int"), "{c}");
        assert!(c.contains("temporal operator search-attribute create --namespace prod.acct --name ForkyardLabels --type KeywordList --name ForkyardForkSlots --type Int"), "{c}");
    }
}
