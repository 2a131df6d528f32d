//! agent-runner errors, their gRPC codes and their activity failure types.

use forkyard_common::activity::{non_retryable, retryable};
use forkyard_proto::activities::errors;
use temporalio_sdk::activities::ActivityError;

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("{0}")]
    InvalidArgument(String),
    /// The sandbox is gone or refuses work; retrying cannot help.
    #[error("sandbox {sandbox_id}: {message}")]
    Sandbox { sandbox_id: String, message: String },
    /// The provisioner could not be reached; a retry may succeed.
    #[error("provisioner {endpoint} unavailable: {message}")]
    Unavailable { endpoint: String, message: String },
    #[error("cancelled")]
    Cancelled,
}

impl From<AgentError> for tonic::Status {
    fn from(e: AgentError) -> Self {
        let msg = e.to_string();
        match e {
            AgentError::InvalidArgument(_) => tonic::Status::invalid_argument(msg),
            AgentError::Sandbox { .. } => tonic::Status::failed_precondition(msg),
            AgentError::Unavailable { .. } => tonic::Status::unavailable(msg),
            AgentError::Cancelled => tonic::Status::cancelled(msg),
        }
    }
}

impl AgentError {
    /// The activity failure for this error: bad input and a vanished sandbox are final,
    /// an unreachable provisioner is retried. (`ActivityError` has a blanket `From`, so
    /// this is a method rather than a `From` impl.)
    pub fn into_activity(self) -> ActivityError {
        match self {
            AgentError::InvalidArgument(m) => non_retryable(errors::INVALID_INPUT, m),
            e @ AgentError::Sandbox { .. } => non_retryable(errors::NOT_FOUND, e),
            e @ AgentError::Unavailable { .. } => retryable("ProvisionerUnavailable", e),
            AgentError::Cancelled => ActivityError::cancelled(),
        }
    }
}
