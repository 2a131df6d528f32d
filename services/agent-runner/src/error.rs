//! agent-runner errors, their gRPC codes and their activity failure types.

use crate::llm::LlmError;
use forkyard_proto::activities::{AgentFailureDetails, errors};
use temporalio_common::error::ApplicationFailure;
use temporalio_sdk::activities::ActivityError;

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("{0}")]
    InvalidArgument(String),
    /// The driver needs an API key this runner was not given.
    #[error(
        "agent.driver: the {driver} driver needs an API key: set {var} in the agent runner's environment"
    )]
    MissingKey { driver: String, var: &'static str },
    /// The sandbox is gone or refuses work; retrying cannot help.
    #[error("sandbox {sandbox_id}: {message}")]
    Sandbox { sandbox_id: String, message: String },
    /// The provisioner could not be reached; a retry may succeed.
    #[error("provisioner {endpoint} unavailable: {message}")]
    Unavailable { endpoint: String, message: String },
    #[error("cancelled")]
    Cancelled,
    /// The ledger refused a charge: the run's budget is spent.
    #[error("budget exceeded: {0}")]
    BudgetExceeded(String),
    /// The ledger failed otherwise; `retry` says whether another attempt may succeed.
    #[error("ledger: {message}")]
    Ledger { message: String, retry: bool },
    #[error(transparent)]
    Model(#[from] LlmError),
    /// A running fork's branch point could not be captured (`CaptureBranchPoint`):
    /// NOT_FOUND (no agent of the fork here), DEADLINE_EXCEEDED (no model request in
    /// time) or FAILED_PRECONDITION (the agent ended first, no snapshot).
    #[error("{message}")]
    BranchPoint { code: tonic::Code, message: String },
}

/// The `ErrorInfo` domain of the runner's errors (`forkyard_common::status`).
pub const DOMAIN: &str = "agent-runner.forkyard";

impl From<AgentError> for tonic::Status {
    /// The code and a stable reason for each error, with the standard details (the field
    /// of bad input, whose message starts with it; when to retry an outage).
    fn from(e: AgentError) -> Self {
        use forkyard_common::status::{invalid_message, with_reason};
        use tonic::Code;
        let msg = e.to_string();
        let (code, reason) = match e {
            AgentError::InvalidArgument(_) => return invalid_message(msg, DOMAIN),
            AgentError::MissingKey { .. } => (Code::FailedPrecondition, "MODEL_KEY_MISSING"),
            AgentError::Sandbox { .. } => (Code::FailedPrecondition, "SANDBOX_UNAVAILABLE"),
            AgentError::BudgetExceeded(_) => (Code::FailedPrecondition, "BUDGET_EXCEEDED"),
            AgentError::Unavailable { .. } => (Code::Unavailable, "PROVISIONER_UNAVAILABLE"),
            AgentError::Ledger { .. } => (Code::Unavailable, "LEDGER_UNAVAILABLE"),
            AgentError::Cancelled => (Code::Cancelled, "CANCELLED"),
            AgentError::Model(LlmError::Rejected { .. }) => {
                (Code::FailedPrecondition, "MODEL_REJECTED")
            }
            AgentError::Model(_) => (Code::Unavailable, "MODEL_UNAVAILABLE"),
            AgentError::BranchPoint { code, .. } => (code, "NO_BRANCH_POINT"),
        };
        with_reason(code, msg, DOMAIN, reason)
    }
}

impl AgentError {
    /// The activity failure for this error: bad input, a vanished sandbox, a spent budget
    /// and a refused model request are final; unreachable services are retried (the
    /// retry resumes from the last heartbeat). (`ActivityError` has a blanket `From`, so
    /// this is a method rather than a `From` impl.)
    pub fn into_activity(self) -> ActivityError {
        self.into_activity_from("")
    }

    /// [`Self::into_activity`], naming the replica (`advertise`) that holds the attempt's
    /// transcript in the failure's details ([`AgentFailureDetails`]).
    pub fn into_activity_from(self, advertise: &str) -> ActivityError {
        self.into_activity_with(advertise, false)
    }

    /// Whether another attempt may succeed (an unreachable model, provisioner or
    /// ledger): the errors [`Self::into_activity_from`] leaves retryable.
    pub fn retryable(&self) -> bool {
        match self {
            AgentError::Unavailable { .. } | AgentError::Ledger { retry: true, .. } => true,
            AgentError::Model(e) => !matches!(e, LlmError::Rejected { .. }),
            _ => false,
        }
    }

    /// [`Self::into_activity_from`], final whatever the error when `spent` (the agent
    /// has used its attempts).
    pub fn into_activity_with(self, advertise: &str, spent: bool) -> ActivityError {
        let (type_name, final_) = match &self {
            AgentError::Cancelled => return ActivityError::cancelled(),
            AgentError::InvalidArgument(_) | AgentError::MissingKey { .. } => {
                (errors::INVALID_INPUT, true)
            }
            AgentError::Sandbox { .. } => (errors::NOT_FOUND, true),
            AgentError::Unavailable { .. } => ("ProvisionerUnavailable", false),
            AgentError::BudgetExceeded(_) => (errors::BUDGET_EXCEEDED, true),
            AgentError::Ledger { retry: true, .. } => ("LedgerUnavailable", false),
            AgentError::Ledger { .. } => ("LedgerRefused", true),
            AgentError::Model(LlmError::Rejected { .. }) => ("ModelRequestRejected", true),
            AgentError::Model(_) => ("ModelUnavailable", false),
            // Only ever a gRPC answer; never an agent's end.
            AgentError::BranchPoint { .. } => ("NoBranchPoint", true),
        };
        let failure = ApplicationFailure::builder(self.to_string())
            .type_name(type_name.to_owned())
            .non_retryable(final_ || spent);
        ActivityError::application(if advertise.is_empty() {
            failure.build()
        } else {
            failure
                .details(AgentFailureDetails {
                    transcript_endpoint: advertise.to_owned(),
                })
                .build()
        })
    }
}
