//! Where a run's sandboxes go: one backend (`backend`) or several in order with their
//! shares (`backends`), checked here for their shape; whether this mesh offers each, and
//! whether the tenant may use it, is asked at admission (`crate::backend_policy`).

use super::fields::field;
use crate::error::GatewayError;
use forkyard_proto::gateway::v1::{BackendShare, LaunchRunRequest};

/// The run's backend (empty: the operator's default) and its list, trimmed; refused
/// naming the field: both given, an unknown or repeated name, a share of 0 before the
/// last entry (it would take no fork, or every fork: say which with a number).
pub(super) fn check(req: &LaunchRunRequest) -> Result<(String, Vec<BackendShare>), GatewayError> {
    let backend = req.backend.trim();
    check_name("backend", backend, true)?;
    if req.backends.is_empty() {
        return Ok((backend.to_owned(), Vec::new()));
    }
    if !backend.is_empty() {
        return Err(field(
            "backends",
            "give either backend or backends, not both",
        ));
    }
    let last = req.backends.len() - 1;
    let mut list: Vec<BackendShare> = Vec::with_capacity(req.backends.len());
    for (i, b) in req.backends.iter().enumerate() {
        let name = b.name.trim();
        check_name(&format!("backends[{i}].name"), name, false)?;
        if let Some(j) = list.iter().position(|seen| seen.name == name) {
            return Err(field(
                &format!("backends[{i}].name"),
                format!("{name} is already backends[{j}]: each backend at most once"),
            ));
        }
        if b.max_concurrent == 0 && i != last {
            return Err(field(
                &format!("backends[{i}].max_concurrent"),
                "must be at least 1 (only the last entry may leave it 0: the rest)",
            ));
        }
        list.push(BackendShare {
            name: name.to_owned(),
            max_concurrent: b.max_concurrent,
        });
    }
    Ok((String::new(), list))
}

/// One of the backends a sandbox can run on (`forkyard_proto::BACKENDS`); empty only
/// where the operator's default applies.
fn check_name(path: &str, name: &str, may_be_empty: bool) -> Result<(), GatewayError> {
    if (may_be_empty && name.is_empty()) || forkyard_proto::BACKENDS.contains(&name) {
        return Ok(());
    }
    Err(field(
        path,
        format!(
            "{name:?} is not a sandbox backend (one of: {})",
            forkyard_proto::BACKENDS.join(", ")
        ),
    ))
}
