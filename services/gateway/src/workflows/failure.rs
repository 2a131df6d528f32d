//! Reading activity failures: which application error type, and a readable message.

use crate::lifecycle::SANDBOX_LOST;
use forkyard_proto::activities::errors;
use temporalio_common::protos::temporal::api::failure::v1::{Failure, failure::FailureInfo};
use temporalio_workflow::common::error::ActivityExecutionError;

#[derive(Clone)]
pub(super) enum StepFailure {
    Cancelled,
    BudgetExceeded(String),
    /// The fork's sandbox went away under its agent (its provisioner replica was killed
    /// or lost its disk): the run starts the fork again on a new sandbox (`record`).
    SandboxLost(String),
    Failed(String),
    /// Its backend refused its create and none after it had room: the run keeps it
    /// pending until one has (`placement`); the message says which.
    WaitsForRoom(String),
}

impl StepFailure {
    /// Whether it says the fork's sandbox is gone ([`SANDBOX_LOST`]).
    pub(super) fn names_lost(&self) -> bool {
        match self {
            Self::Cancelled => false,
            Self::BudgetExceeded(m)
            | Self::SandboxLost(m)
            | Self::Failed(m)
            | Self::WaitsForRoom(m) => m.contains(SANDBOX_LOST),
        }
    }
}

/// Error types of an agent step that mean its sandbox is gone: the runner's NotFound
/// (the replica answered without it) and ProvisionerUnavailable (its replica did not
/// answer through the activity's retries).
const LOST_SANDBOX_TYPES: [&str; 2] = [errors::NOT_FOUND, "ProvisionerUnavailable"];

/// The innermost application failure's type and message, walking the cause chain
/// (an activity failure wraps the application failure the activity returned).
fn application(f: &Failure) -> (Option<String>, String) {
    let mut cur = Some(f);
    let mut last_msg = f.message.clone();
    while let Some(x) = cur {
        if !x.message.is_empty() {
            last_msg.clone_from(&x.message);
        }
        if let Some(FailureInfo::ApplicationFailureInfo(info)) = &x.failure_info {
            return (Some(info.r#type.clone()), x.message.clone());
        }
        cur = x.cause.as_deref();
    }
    (None, last_msg)
}

/// Whether a failed activity might succeed if asked again later: its innermost
/// application failure is not final, or it timed out (the service did not answer).
pub(super) fn retryable(e: &ActivityExecutionError) -> bool {
    if !matches!(e, ActivityExecutionError::Failed(_)) {
        return false;
    }
    let mut cur = e.failure();
    while let Some(f) = cur {
        match &f.failure_info {
            Some(FailureInfo::ApplicationFailureInfo(info)) => return !info.non_retryable,
            Some(FailureInfo::TimeoutFailureInfo(_)) => return true,
            _ => {}
        }
        cur = f.cause.as_deref();
    }
    false
}

/// The JSON details of the innermost application failure (`None` when it has none or
/// they do not decode as `T`).
pub(super) fn details<T: serde::de::DeserializeOwned>(e: &ActivityExecutionError) -> Option<T> {
    let mut cur = e.failure();
    while let Some(f) = cur {
        if let Some(FailureInfo::ApplicationFailureInfo(info)) = &f.failure_info {
            let payload = info.details.as_ref()?.payloads.first()?;
            return serde_json::from_slice(&payload.data).ok();
        }
        cur = f.cause.as_deref();
    }
    None
}

/// A step's failure from its application error type (e.g. `BudgetExceeded`) and message,
/// also where the type came without an activity failure (a batch's per-fork outcome).
pub(super) fn refused(step: &str, error_type: Option<&str>, msg: &str) -> StepFailure {
    if error_type == Some(errors::BUDGET_EXCEEDED) {
        StepFailure::BudgetExceeded(format!("{step}: {msg}"))
    } else {
        StepFailure::Failed(format!("{step}: {msg}"))
    }
}

pub(super) fn classify(step: &str, e: &ActivityExecutionError) -> StepFailure {
    match e {
        ActivityExecutionError::Cancelled(_) => StepFailure::Cancelled,
        ActivityExecutionError::Failed(_) => {
            let (ty, msg) = e
                .failure()
                .map(application)
                .unwrap_or((None, e.to_string()));
            if step == "run agent"
                && ty
                    .as_deref()
                    .is_some_and(|t| LOST_SANDBOX_TYPES.contains(&t))
            {
                return StepFailure::SandboxLost(format!("{step}: {SANDBOX_LOST}: {msg}"));
            }
            refused(step, ty.as_deref(), &msg)
        }
        ActivityExecutionError::Serialization(err) => StepFailure::Failed(format!("{step}: {err}")),
        #[allow(unreachable_patterns)]
        _ => StepFailure::Failed(format!("{step}: {e}")),
    }
}

/// The fork's error for a step failure.
pub(super) fn failure_message(f: StepFailure) -> String {
    match f {
        StepFailure::Cancelled => "cancelled".to_owned(),
        StepFailure::BudgetExceeded(m)
        | StepFailure::SandboxLost(m)
        | StepFailure::Failed(m)
        | StepFailure::WaitsForRoom(m) => m,
    }
}
