//! Activity options per step: task queue, timeouts and the retry table from the seed
//! (create 3×/5 s/×2, agent 2×/10 s/×2, cleanup 3×/2 s/×2, health 1×).

use forkyard_proto::{activities::errors, queues};
use std::time::Duration;
use temporalio_common::RetryPolicy;
use temporalio_workflow::{ActivityOptions, WorkflowCancellationToken};

fn retry(attempts: u32, initial_secs: u64, non_retryable: &[&str]) -> RetryPolicy {
    RetryPolicy::builder()
        .maximum_attempts(attempts)
        .initial_interval(Duration::from_secs(initial_secs))
        .backoff_coefficient(2.0)
        .non_retryable_error_types(non_retryable.iter().map(|s| (*s).to_owned()))
        .build()
}

const FINAL: &[&str] = &[
    errors::INVALID_INPUT,
    errors::NOT_FOUND,
    errors::SANDBOX_AUTH,
    errors::BUDGET_EXCEEDED,
];

pub(super) fn ledger() -> ActivityOptions {
    ActivityOptions::with_start_to_close_timeout(Duration::from_secs(30))
        .task_queue(queues::BUDGET_LEDGER.to_owned())
        .retry_policy(retry(5, 1, FINAL))
        .build()
}

pub(super) fn create() -> ActivityOptions {
    ActivityOptions::with_start_to_close_timeout(Duration::from_secs(300))
        .task_queue(queues::SANDBOX_PROVISIONER.to_owned())
        .retry_policy(retry(
            3,
            5,
            &[
                errors::INVALID_INPUT,
                errors::SANDBOX_AUTH,
                "RepoUnavailable",
            ],
        ))
        .build()
}

pub(super) fn health() -> ActivityOptions {
    ActivityOptions::with_start_to_close_timeout(Duration::from_secs(60))
        .task_queue(queues::SANDBOX_PROVISIONER.to_owned())
        .retry_policy(retry(1, 1, &[]))
        .build()
}

pub(super) fn collect_patch() -> ActivityOptions {
    ActivityOptions::with_start_to_close_timeout(Duration::from_secs(600))
        .task_queue(queues::SANDBOX_PROVISIONER.to_owned())
        .retry_policy(retry(3, 2, FINAL))
        .build()
}

/// The agent may run for the fork's whole timeout; heartbeats prove it is alive and are
/// how cancellation reaches it.
pub(super) fn agent(fork_timeout_secs: u32) -> ActivityOptions {
    ActivityOptions::with_start_to_close_timeout(Duration::from_secs(
        u64::from(fork_timeout_secs) + 60,
    ))
    .task_queue(queues::AGENT_RUNNER.to_owned())
    .heartbeat_timeout(Duration::from_secs(20))
    .retry_policy(retry(
        2,
        10,
        &[
            errors::AGENT_TIMEOUT,
            errors::BUDGET_EXCEEDED,
            errors::INVALID_INPUT,
        ],
    ))
    .build()
}

/// The verify command: its failure is a result, not something to retry.
pub(super) fn verify(timeout_secs: u32) -> ActivityOptions {
    ActivityOptions::with_start_to_close_timeout(Duration::from_secs(u64::from(timeout_secs) + 60))
        .task_queue(queues::SANDBOX_PROVISIONER.to_owned())
        .heartbeat_timeout(Duration::from_secs(30))
        .retry_policy(retry(1, 1, &[]))
        .build()
}

/// Cleanup runs on a fresh cancellation token so that it still happens after the
/// workflow itself was cancelled.
pub(super) fn destroy() -> ActivityOptions {
    ActivityOptions::with_start_to_close_timeout(Duration::from_secs(120))
        .task_queue(queues::SANDBOX_PROVISIONER.to_owned())
        .retry_policy(retry(3, 2, &[]))
        .cancellation_token(WorkflowCancellationToken::new())
        .build()
}

/// Ledger calls that must complete whatever the workflow's cancellation: a reservation
/// made must be seen (to be settled), and settlement after a cancel must happen.
pub(super) fn ledger_detached() -> ActivityOptions {
    ActivityOptions::with_start_to_close_timeout(Duration::from_secs(30))
        .task_queue(queues::BUDGET_LEDGER.to_owned())
        .retry_policy(retry(5, 1, FINAL))
        .cancellation_token(WorkflowCancellationToken::new())
        .build()
}
