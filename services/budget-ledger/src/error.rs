//! The ledger's one error type, and how it reads as a gRPC status and as an activity
//! failure.

use forkyard_common::activity::{non_retryable, retryable};
use forkyard_proto::activities::errors;
use temporalio_sdk::activities::ActivityError;

/// Activity error type for a precondition that will not change on retry (e.g. committing a
/// released reservation).
pub const FAILED_PRECONDITION: &str = "FailedPrecondition";
/// Activity error type for opening an existing account with another budget.
pub const ALREADY_EXISTS: &str = "AlreadyExists";
/// Activity error type for database trouble; retried.
pub const DATABASE: &str = "DatabaseError";
/// Activity error type for stored data the ledger cannot read; not retried.
pub const CORRUPT: &str = "CorruptLedger";

#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    /// Bad input; `field` names the request field.
    #[error("{field}: {reason}")]
    InvalidArgument { field: &'static str, reason: String },
    #[error(
        "idempotency key reused with different parameters: {key:?} was first used for {operation}"
    )]
    KeyReused { key: String, operation: String },
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    AlreadyExists(String),
    /// A reservation larger than what the account has left.
    #[error("budget exceeded: {0}")]
    BudgetExceeded(String),
    #[error("{0}")]
    FailedPrecondition(String),
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    /// The call was not applied (e.g. its batch failed to commit); retrying is safe.
    #[error("ledger unavailable: {0}")]
    Unavailable(String),
    #[error("database migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// A stored row the code cannot read back (unknown state, unparsable response).
    #[error("corrupt ledger data: {0}")]
    Corrupt(String),
}

impl LedgerError {
    pub(crate) fn invalid(field: &'static str, reason: impl Into<String>) -> Self {
        Self::InvalidArgument {
            field,
            reason: reason.into(),
        }
    }

    /// Whether retrying the same call may succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            Self::Database(_) | Self::Migrate(_) | Self::Unavailable(_)
        )
    }
}

/// The `ErrorInfo` domain of the ledger's errors (`forkyard_common::status`).
pub const DOMAIN: &str = "budget-ledger.forkyard";

impl From<LedgerError> for tonic::Status {
    /// The code and a stable reason for each error, with the standard details (the field
    /// of bad input, when to retry a busy database).
    fn from(e: LedgerError) -> Self {
        use forkyard_common::status::{invalid_field, with_reason};
        use tonic::Code;
        let msg = e.to_string();
        let (code, reason) = match &e {
            LedgerError::InvalidArgument { field, reason } => {
                return invalid_field(field, reason, msg, DOMAIN);
            }
            LedgerError::KeyReused { .. } => {
                return invalid_field(
                    "idempotency_key",
                    "reused with different parameters",
                    msg,
                    DOMAIN,
                );
            }
            LedgerError::NotFound(_) => (Code::NotFound, "NOT_FOUND"),
            LedgerError::AlreadyExists(_) => (Code::AlreadyExists, "ALREADY_EXISTS"),
            LedgerError::BudgetExceeded(_) => (Code::FailedPrecondition, "BUDGET_EXCEEDED"),
            LedgerError::FailedPrecondition(_) => (Code::FailedPrecondition, "FAILED_PRECONDITION"),
            LedgerError::Database(db) if is_busy(db) => (Code::Unavailable, "DATABASE_BUSY"),
            LedgerError::Unavailable(_) => (Code::Unavailable, "DATABASE_UNAVAILABLE"),
            LedgerError::Database(_) | LedgerError::Migrate(_) | LedgerError::Corrupt(_) => {
                tracing::error!(error = %msg, "ledger internal error");
                (Code::Internal, "INTERNAL")
            }
        };
        with_reason(code, msg, DOMAIN, reason)
    }
}

impl LedgerError {
    /// The activity failure for this error. (`ActivityError` already converts from every
    /// `std::error::Error` as a plain retryable failure, so this is a method, not `From`:
    /// use `.map_err(LedgerError::into_activity_error)`, never `?`.)
    pub fn into_activity_error(self) -> ActivityError {
        let e = self;
        match &e {
            LedgerError::BudgetExceeded(_) => non_retryable(errors::BUDGET_EXCEEDED, e),
            LedgerError::InvalidArgument { .. } | LedgerError::KeyReused { .. } => {
                non_retryable(errors::INVALID_INPUT, e)
            }
            LedgerError::NotFound(_) => non_retryable(errors::NOT_FOUND, e),
            LedgerError::AlreadyExists(_) => non_retryable(ALREADY_EXISTS, e),
            LedgerError::FailedPrecondition(_) => non_retryable(FAILED_PRECONDITION, e),
            LedgerError::Corrupt(_) => non_retryable(CORRUPT, e),
            LedgerError::Database(_) | LedgerError::Migrate(_) | LedgerError::Unavailable(_) => {
                retryable(DATABASE, e)
            }
        }
    }
}

/// SQLite "database is locked / busy" after the busy timeout, PostgreSQL serialization
/// failures and deadlocks: the caller may retry.
fn is_busy(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Database(db) => {
            matches!(
                db.code().as_deref(),
                Some("5") | Some("6") | Some("517") | Some("40001") | Some("40P01")
            )
        }
        sqlx::Error::PoolTimedOut => true,
        _ => false,
    }
}
