//! The janitor's errors, as gRPC statuses and activity failures.

use forkyard_common::activity::{non_retryable, retryable};
use temporalio_sdk::activities::ActivityError;

#[derive(Debug, thiserror::Error)]
pub enum JanitorError {
    /// The sandbox provisioner could not be reached.
    #[error("sandbox provisioner unreachable: {0}")]
    ProvisionerUnavailable(String),
    /// The provisioner answered with an error.
    #[error("sandbox provisioner: {0}")]
    Provisioner(tonic::Status),
    /// Temporal could not be asked about a workflow.
    #[error("temporal: {0}")]
    Temporal(String),
    #[error("{field}: {reason}")]
    InvalidArgument { field: &'static str, reason: String },
    /// The budget ledger refused or could not be reached.
    #[error("budget ledger: {0}")]
    Ledger(String),
}

impl JanitorError {
    /// A provisioner status, telling "unreachable" from an answer.
    pub fn from_provisioner(status: tonic::Status) -> Self {
        match status.code() {
            tonic::Code::Unavailable | tonic::Code::DeadlineExceeded => {
                Self::ProvisionerUnavailable(status.message().to_owned())
            }
            _ => Self::Provisioner(status),
        }
    }

    /// The activity failure for this error (a method, not `From`: `ActivityError` already
    /// converts from any error as a generic failure).
    pub fn into_activity_error(self) -> ActivityError {
        match &self {
            Self::InvalidArgument { .. } => {
                non_retryable(forkyard_proto::activities::errors::INVALID_INPUT, self)
            }
            Self::ProvisionerUnavailable(_) => retryable("ProvisionerUnavailable", self),
            Self::Provisioner(_) => retryable("ProvisionerError", self),
            Self::Temporal(_) => retryable("TemporalError", self),
            Self::Ledger(_) => retryable("LedgerError", self),
        }
    }
}

/// The `ErrorInfo` domain of the janitor's errors (`forkyard_common::status`).
pub const DOMAIN: &str = "janitor.forkyard";

impl From<JanitorError> for tonic::Status {
    /// The code and a stable reason for each error, with the standard details (the field
    /// of bad input, when to retry an outage).
    fn from(e: JanitorError) -> Self {
        use forkyard_common::status::{invalid_field, with_reason};
        use tonic::Code;
        let msg = e.to_string();
        let (code, reason) = match &e {
            JanitorError::InvalidArgument { field, reason } => {
                return invalid_field(field, reason, msg, DOMAIN);
            }
            JanitorError::ProvisionerUnavailable(_) => {
                (Code::Unavailable, "PROVISIONER_UNAVAILABLE")
            }
            JanitorError::Temporal(_) => (Code::Unavailable, "TEMPORAL_UNAVAILABLE"),
            JanitorError::Ledger(_) => (Code::Unavailable, "LEDGER_UNAVAILABLE"),
            JanitorError::Provisioner(status) => (status.code(), "PROVISIONER_ERROR"),
        };
        with_reason(code, msg, DOMAIN, reason)
    }
}
