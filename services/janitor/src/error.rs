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

impl From<JanitorError> for tonic::Status {
    fn from(e: JanitorError) -> Self {
        let msg = e.to_string();
        match e {
            JanitorError::ProvisionerUnavailable(_)
            | JanitorError::Temporal(_)
            | JanitorError::Ledger(_) => tonic::Status::unavailable(msg),
            JanitorError::Provisioner(status) => tonic::Status::new(status.code(), msg),
            JanitorError::InvalidArgument { .. } => tonic::Status::invalid_argument(msg),
        }
    }
}
