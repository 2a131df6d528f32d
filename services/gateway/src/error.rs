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

/// The `ErrorInfo` domain of the gateway's errors (`forkyard_common::status`).
pub const DOMAIN: &str = "gateway.forkyard";

impl From<GatewayError> for tonic::Status {
    /// The code and a stable reason for each error, with the standard details: the field
    /// of bad input (its message starts with it), when to retry an outage or a limit.
    fn from(e: GatewayError) -> Self {
        use forkyard_common::status::{invalid_message, with_reason};
        use tonic::Code;
        let msg = e.to_string();
        let (code, reason) = match e {
            GatewayError::InvalidArgument(_) => return invalid_message(msg, DOMAIN),
            GatewayError::Unavailable(_) => (Code::Unavailable, "DEPENDENCY_UNAVAILABLE"),
            GatewayError::FailedPrecondition(_) => {
                (Code::FailedPrecondition, "FAILED_PRECONDITION")
            }
            GatewayError::RunNotFound(_) => (Code::NotFound, "RUN_NOT_FOUND"),
            GatewayError::NotFound(_) => (Code::NotFound, "NOT_FOUND"),
            GatewayError::AlreadyExists(_) => (Code::AlreadyExists, "ALREADY_EXISTS"),
            GatewayError::Temporal(_) => (Code::Unavailable, "TEMPORAL_UNAVAILABLE"),
            GatewayError::Internal(_) => (Code::Internal, "INTERNAL"),
            GatewayError::ResourceExhausted(_) => (Code::ResourceExhausted, "LIMIT_REACHED"),
            GatewayError::PermissionDenied(_) => (Code::PermissionDenied, "PERMISSION_DENIED"),
            GatewayError::DeadlineExceeded(_) => (Code::DeadlineExceeded, "DEADLINE_EXCEEDED"),
        };
        with_reason(code, msg, DOMAIN, reason)
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
