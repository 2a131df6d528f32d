//! Turning service errors into activity failures Temporal understands.

use temporalio_common::error::ApplicationFailure;
use temporalio_sdk::activities::ActivityError;

/// A failure Temporal retries per the activity's retry policy.
pub fn retryable(type_name: &str, err: impl std::fmt::Display) -> ActivityError {
    ActivityError::application(
        ApplicationFailure::builder(err.to_string())
            .type_name(type_name.to_owned())
            .build(),
    )
}

/// A failure Temporal never retries (bad input, budget exceeded, auth failure).
pub fn non_retryable(type_name: &str, err: impl std::fmt::Display) -> ActivityError {
    ActivityError::application(
        ApplicationFailure::builder(err.to_string())
            .type_name(type_name.to_owned())
            .non_retryable(true)
            .build(),
    )
}
