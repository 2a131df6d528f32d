//! The provisioner's one error type, and how it crosses each front door: a gRPC
//! `Status` for callers over the wire, an `ActivityError` for Temporal workflows.

use forkyard_common::activity::{non_retryable, retryable};
use forkyard_proto::activities::errors;
use temporalio_sdk::activities::ActivityError;

/// Activity failure type for a repository that cannot be cloned (final, not retried).
pub const REPO_UNAVAILABLE: &str = "RepoUnavailable";
/// Activity failure type for a sandbox in the wrong state (e.g. being destroyed).
pub const SANDBOX_UNAVAILABLE: &str = "SandboxUnavailable";
/// Activity failure type for a remote backend that is down or slow (retried).
pub const UNAVAILABLE: &str = "SandboxBackendUnavailable";
/// Activity failure type for a create refused by a replica that is shutting down: a
/// replica that takes creates (this one restarted, or another) will make it.
pub const DRAINING: &str = forkyard_proto::activities::errors::SANDBOX_DRAINING;
/// Activity failure type for everything else (retried per the activity's policy).
pub const INTERNAL: &str = "SandboxInternal";

#[derive(Debug, Clone, thiserror::Error)]
pub enum ProvisionerError {
    /// The request is wrong; `field` names the offending request field.
    #[error("invalid {field}: {reason}")]
    InvalidArgument { field: &'static str, reason: String },
    #[error("sandbox {0} not found")]
    NotFound(String),
    /// The repository cannot be cloned or lacks what was asked for.
    #[error("repository unavailable: {0}")]
    RepoUnavailable(String),
    /// The sandbox exists but cannot do this now (e.g. it is being destroyed).
    #[error("{0}")]
    FailedPrecondition(String),
    #[error("{0}")]
    Internal(String),
    /// A remote backend rejected our credentials (final: retrying cannot help).
    #[error("{0}")]
    Auth(String),
    /// A remote backend is unreachable, overloaded or timed out (retried).
    #[error("{0}")]
    Unavailable(String),
    /// This replica is shutting down and makes no new sandbox (retried elsewhere, or
    /// here after its restart). Marked on the wire ([`DRAINING_METADATA`]) so callers
    /// tell it from an outage without reading the message.
    #[error("{0}")]
    Draining(String),
}

/// The metadata key a [`ProvisionerError::Draining`] status carries.
pub const DRAINING_METADATA: &str = forkyard_proto::activities::errors::DRAINING_METADATA;

impl ProvisionerError {
    pub fn invalid(field: &'static str, reason: impl Into<String>) -> Self {
        Self::InvalidArgument {
            field,
            reason: reason.into(),
        }
    }

    pub fn internal(context: &str, err: impl std::fmt::Display) -> Self {
        Self::Internal(format!("{context}: {err}"))
    }

    /// The Temporal view: bad input, a missing repo or sandbox are final; the rest is
    /// retried by the activity's retry policy.
    pub fn into_activity_error(self) -> ActivityError {
        match &self {
            Self::InvalidArgument { .. } => non_retryable(errors::INVALID_INPUT, &self),
            Self::NotFound(_) => non_retryable(errors::NOT_FOUND, &self),
            Self::RepoUnavailable(_) => non_retryable(REPO_UNAVAILABLE, &self),
            Self::FailedPrecondition(_) => non_retryable(SANDBOX_UNAVAILABLE, &self),
            Self::Internal(_) => retryable(INTERNAL, &self),
            Self::Auth(_) => non_retryable(errors::SANDBOX_AUTH, &self),
            Self::Unavailable(_) => retryable(UNAVAILABLE, &self),
            Self::Draining(_) => retryable(DRAINING, &self),
        }
    }
}

/// The `ErrorInfo` domain of the provisioner's errors (`forkyard_common::status`).
pub const DOMAIN: &str = "sandbox-provisioner.forkyard";

impl From<ProvisionerError> for tonic::Status {
    /// The code and a stable reason for each error, with the standard details (the field
    /// of bad input, when to retry an outage).
    fn from(err: ProvisionerError) -> Self {
        use forkyard_common::status::{invalid_field, with_reason};
        use tonic::Code;
        let msg = err.to_string();
        let (code, reason) = match &err {
            ProvisionerError::InvalidArgument { field, reason } => {
                return invalid_field(field, reason, msg, DOMAIN);
            }
            ProvisionerError::NotFound(_) => (Code::NotFound, "SANDBOX_NOT_FOUND"),
            ProvisionerError::RepoUnavailable(_) => (Code::FailedPrecondition, "REPO_UNAVAILABLE"),
            ProvisionerError::FailedPrecondition(_) => {
                (Code::FailedPrecondition, "SANDBOX_UNAVAILABLE")
            }
            ProvisionerError::Internal(_) => (Code::Internal, "INTERNAL"),
            ProvisionerError::Auth(_) => (Code::PermissionDenied, "BACKEND_AUTH"),
            ProvisionerError::Unavailable(_) => (Code::Unavailable, "BACKEND_UNAVAILABLE"),
            ProvisionerError::Draining(_) => (Code::Unavailable, "DRAINING"),
        };
        let mut s = with_reason(code, msg, DOMAIN, reason);
        if matches!(err, ProvisionerError::Draining(_)) {
            s.metadata_mut().insert(
                DRAINING_METADATA,
                tonic::metadata::MetadataValue::from_static("1"),
            );
        }
        s
    }
}

pub type Result<T, E = ProvisionerError> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_codes_and_messages() {
        let s: tonic::Status =
            ProvisionerError::invalid("branch", "not a valid branch name").into();
        assert_eq!(s.code(), tonic::Code::InvalidArgument);
        assert!(s.message().contains("branch"), "{}", s.message());
        let s: tonic::Status = ProvisionerError::NotFound("sbx-1".into()).into();
        assert_eq!(s.code(), tonic::Code::NotFound);
        let s: tonic::Status = ProvisionerError::RepoUnavailable("no such repo".into()).into();
        assert_eq!(s.code(), tonic::Code::FailedPrecondition);
        let s: tonic::Status = ProvisionerError::Internal("disk full".into()).into();
        assert_eq!(s.code(), tonic::Code::Internal);
    }

    #[test]
    fn remote_backend_errors_auth_final_unavailable_retried() {
        let kind = |e: ProvisionerError| match e.into_activity_error() {
            ActivityError::Application(f) => {
                (f.type_name().map(str::to_owned), f.is_non_retryable())
            }
            other => panic!("{other:?}"),
        };
        assert_eq!(
            kind(ProvisionerError::Auth("401".into())),
            (Some(errors::SANDBOX_AUTH.to_owned()), true)
        );
        assert_eq!(
            kind(ProvisionerError::Unavailable("503".into())),
            (Some(UNAVAILABLE.to_owned()), false)
        );
    }
}
