//! The gateway's errors and their gRPC status codes.

use temporalio_client::errors::{WorkflowInteractionError, WorkflowQueryError, WorkflowStartError};

#[derive(Debug, Clone, thiserror::Error)]
pub enum GatewayError {
    /// Bad input; the message starts with the field's name.
    #[error("{0}")]
    InvalidArgument(String),
    /// A service the call needs (the agent runner) cannot be reached.
    #[error("{0}")]
    Unavailable(String),
    #[error("{0}")]
    FailedPrecondition(String),
    #[error("run {0} not found")]
    RunNotFound(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    AlreadyExists(String),
    #[error("temporal: {0}")]
    Temporal(String),
    #[error("{0}")]
    Internal(String),
    /// A limit (the tenant's concurrent forks, its spending limit) refuses the call.
    #[error("{0}")]
    ResourceExhausted(String),
    #[error("{0}")]
    PermissionDenied(String),
    #[error("{0}")]
    DeadlineExceeded(String),
}

impl GatewayError {
    pub fn field(field: &str, msg: impl std::fmt::Display) -> Self {
        Self::InvalidArgument(format!("{field}: {msg}"))
    }
}

impl From<GatewayError> for tonic::Status {
    fn from(e: GatewayError) -> Self {
        let msg = e.to_string();
        match e {
            GatewayError::InvalidArgument(_) => tonic::Status::invalid_argument(msg),
            GatewayError::Unavailable(_) => tonic::Status::unavailable(msg),
            GatewayError::FailedPrecondition(_) => tonic::Status::failed_precondition(msg),
            GatewayError::RunNotFound(_) | GatewayError::NotFound(_) => {
                tonic::Status::not_found(msg)
            }
            GatewayError::AlreadyExists(_) => tonic::Status::already_exists(msg),
            GatewayError::Temporal(_) => tonic::Status::unavailable(msg),
            GatewayError::Internal(_) => tonic::Status::internal(msg),
            GatewayError::ResourceExhausted(_) => tonic::Status::resource_exhausted(msg),
            GatewayError::PermissionDenied(_) => tonic::Status::permission_denied(msg),
            GatewayError::DeadlineExceeded(_) => tonic::Status::deadline_exceeded(msg),
        }
    }
}

impl GatewayError {
    pub fn from_interaction(run_id: &str, e: WorkflowInteractionError) -> Self {
        match e {
            WorkflowInteractionError::NotFound(_) => Self::RunNotFound(run_id.to_owned()),
            other => Self::Temporal(other.to_string()),
        }
    }

    pub fn from_query(run_id: &str, e: WorkflowQueryError) -> Self {
        match e {
            WorkflowQueryError::NotFound(_) => Self::RunNotFound(run_id.to_owned()),
            other => Self::Temporal(other.to_string()),
        }
    }

    /// Temporal refusing a start for a reason of its own (a namespace that does not exist,
    /// a bad request) is not a transient outage: keep its code.
    pub fn from_start(e: WorkflowStartError) -> Self {
        match e {
            WorkflowStartError::Rpc(s) => match s.code() {
                tonic::Code::Unavailable
                | tonic::Code::DeadlineExceeded
                | tonic::Code::ResourceExhausted => Self::Temporal(s.message().to_owned()),
                tonic::Code::NotFound
                | tonic::Code::InvalidArgument
                | tonic::Code::PermissionDenied => {
                    Self::FailedPrecondition(format!("temporal refused the run: {}", s.message()))
                }
                _ => Self::Internal(format!("temporal: {}", s.message())),
            },
            other => Self::Internal(other.to_string()),
        }
    }
}
