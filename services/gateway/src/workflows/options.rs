//! Activity options per step: task queue, timeouts and retries (the seed's table:
//! create 3×/5 s/×2, agent 2×/10 s/×2, health 1×; a wave's reserve, create and health
//! check take their retries from `prepare`'s rounds). A fork's last steps (patch, ledger,
//! destroy) take theirs from the one table the gateway's finish activity also retries
//! by (`crate::lifecycle::tries`). The sandbox control calls and the ledger calls are
//! local activities of the gateway's worker; the agent and the verify command are
//! activities on their services' queues.

use crate::lifecycle::tries::{self, Tries};
use forkyard_proto::{activities::errors, queues};
use std::time::Duration;
use temporalio_common::RetryPolicy;
use temporalio_workflow::{
    ActivityCloseTimeouts, ActivityOptions, LocalActivityOptions, WorkflowCancellationToken,
};

fn retry(attempts: u32, initial_secs: u64, non_retryable: &[&str]) -> RetryPolicy {
    RetryPolicy::builder()
        .maximum_attempts(attempts)
        .initial_interval(Duration::from_secs(initial_secs))
        .backoff_coefficient(2.0)
        .non_retryable_error_types(non_retryable.iter().map(|s| (*s).to_owned()))
        .build()
}

/// A step's Temporal retry policy from its row of the one table.
fn policy(t: Tries) -> RetryPolicy {
    RetryPolicy::builder()
        .maximum_attempts(t.attempts)
        .initial_interval(t.first)
        .backoff_coefficient(2.0)
        .maybe_maximum_interval(t.longest)
        .non_retryable_error_types(t.never.iter().map(|s| (*s).to_owned()))
        .build()
}

/// Ledger calls run as local activities of the gateway's worker (see `crate::activities::ledger`):
/// retried as [`tries::LEDGER`] says, never for budget exhaustion or bad input.
pub(super) fn ledger() -> LocalActivityOptions {
    LocalActivityOptions::builder()
        .retry_policy(policy(tries::LEDGER))
        .start_to_close_timeout(Duration::from_secs(15))
        .schedule_to_close_timeout(Duration::from_secs(120))
        .build()
}

/// Ledger calls that must complete whatever the workflow's cancellation: a reservation
/// made must be seen (to be settled), and settlement after a cancel must happen.
pub(super) fn ledger_detached() -> LocalActivityOptions {
    LocalActivityOptions::builder()
        .retry_policy(policy(tries::LEDGER))
        .start_to_close_timeout(Duration::from_secs(15))
        .schedule_to_close_timeout(Duration::from_secs(120))
        .cancellation_token(WorkflowCancellationToken::new())
        .build()
}

/// A settlement the ledger did not take in time (it was down or slow): posted again as a
/// regular activity on the ledger's queue, as [`tries::SETTLE_DURABLY`] says, and
/// whatever the run's cancellation, since spend that happened must be posted.
/// The idempotency key is the first attempt's: it is posted once.
pub(super) fn ledger_durable() -> ActivityOptions {
    let t = tries::SETTLE_DURABLY;
    ActivityOptions::with_close_timeouts(ActivityCloseTimeouts::ScheduleAndStartToClose {
        schedule_to_close: t.within.unwrap_or_default(),
        start_to_close: Duration::from_secs(60),
    })
    .task_queue(queues::BUDGET_LEDGER.to_owned())
    .cancellation_token(WorkflowCancellationToken::new())
    .retry_policy(policy(t))
    .build()
}

/// The queue for every call about an existing sandbox: its owner replica's own queue
/// (Temporal's worker-specific task queue), so the call reaches the host that has it.
/// Sandboxes from a provisioner that names no queue fall back to the shared one.
pub(super) fn sandbox_queue(owner_task_queue: &str) -> &str {
    if owner_task_queue.is_empty() {
        queues::SANDBOX_PROVISIONER
    } else {
        owner_task_queue
    }
}

/// A wave's preparation (`crate::activities::wave`): it answers for every fork and never fails as a
/// whole, so a retry here is only for an attempt that timed out or a worker that went
/// away (it sends every fork again under the same idempotency keys). Longer than the
/// slowest fork's three calls (see their deadlines), and on a fresh cancellation token: a
/// cancel must not lose a sandbox being made. The per-fork retries (the seed's create
/// policy) are the workflow's rounds (`prepare::ROUNDS`).
pub(super) fn wave_local() -> LocalActivityOptions {
    LocalActivityOptions::builder()
        .retry_policy(retry(3, 5, &[]))
        .start_to_close_timeout(Duration::from_secs(420))
        .cancellation_token(WorkflowCancellationToken::new())
        .build()
}

/// A later wave's preparation as a regular activity on the gateway's own queue (see
/// `patches::Change::LaterWavesAreActivities`), with the local one's timeout and retries;
/// it heartbeats, so a gateway that died mid-way is noticed in 30 s. The retry sends every
/// fork again under the same idempotency keys.
pub(super) fn wave() -> ActivityOptions {
    on_gateway_queue(Duration::from_secs(420))
}

/// A batch of inline forks' last steps (`crate::activities::finish`), a regular activity on the
/// gateway's own queue: as a local activity it held the run's workflow task open while
/// the other forks' agent completions piled up, and past 100 buffered events Temporal
/// force-fails that task. Each step retries inside (the child's table), so a retry here is only for an
/// attempt that timed out or a worker that went away. On a fresh cancellation token: a
/// cancelled fork must still be settled and its sandbox destroyed.
pub(super) fn finish() -> ActivityOptions {
    on_gateway_queue(Duration::from_secs(720))
}

/// The run's delivery (`workflows::deliver`): one fetch, one push, the pull requests.
pub(super) fn deliver() -> ActivityOptions {
    on_gateway_queue(Duration::from_secs(900))
}

/// A heartbeating activity of the gateway's own (`WaveLocal`) on its queue: a gateway that
/// died mid-way is noticed in 30 s, not at `start_to_close`; retried for an attempt that
/// timed out or a worker that went away; on a fresh cancellation token.
fn on_gateway_queue(start_to_close: Duration) -> ActivityOptions {
    let mut opts = ActivityOptions::with_start_to_close_timeout(start_to_close)
        .task_queue(queues::ORCHESTRATION.to_owned())
        .heartbeat_timeout(Duration::from_secs(30))
        .retry_policy(retry(3, 5, &[]))
        .build();
    opts.cancellation_token = Some(WorkflowCancellationToken::new());
    opts
}

/// The child's patch step, retried as [`tries::PATCH`] says.
pub(super) fn collect_patch_local() -> LocalActivityOptions {
    LocalActivityOptions::builder()
        .retry_policy(policy(tries::PATCH))
        .start_to_close_timeout(Duration::from_secs(600))
        .build()
}

/// A sandbox's destroy, whatever the workflow's cancellation: for minutes
/// ([`tries::DESTROY`]: a provisioner restarting or away for a minute must not leave the
/// sandbox behind), or briefly when it is known lost ([`tries::DESTROY_LOST`]: the run
/// must not wait for a replica that is gone). One that still fails is left to the
/// janitor, whose sweep reaps it once its workflow has closed.
pub(super) fn destroy_local(lost: bool) -> LocalActivityOptions {
    let t = if lost {
        tries::DESTROY_LOST
    } else {
        tries::DESTROY
    };
    LocalActivityOptions::builder()
        .retry_policy(policy(t))
        .start_to_close_timeout(Duration::from_secs(120))
        .maybe_schedule_to_close_timeout(t.within)
        .cancellation_token(WorkflowCancellationToken::new())
        .build()
}

/// Attempts of an agent lost with its runner (killed, its heartbeats stopped: the
/// heartbeat timeout), on top of the agent's own two (the seed's table), which the runner
/// counts and ends itself (agent-runner's `OWN_ATTEMPTS`): a lost worker is not the
/// agent's failure. Each loss costs the heartbeat timeout and a backoff.
pub const WORKER_LOSSES: u32 = 4;

/// The agent may run for the fork's whole timeout; heartbeats prove it is alive and are
/// how cancellation reaches it. Retried for its own failures twice and for lost workers
/// [`WORKER_LOSSES`] times more, all within the fork's deadline: at most three times the
/// fork's timeout from its first start (an attempt started after a loss starts the agent
/// over: see docs/run-workflow.md).
pub(super) fn agent(fork_timeout_secs: u32) -> ActivityOptions {
    let attempt = Duration::from_secs(u64::from(fork_timeout_secs) + 60);
    ActivityOptions::with_close_timeouts(ActivityCloseTimeouts::ScheduleAndStartToClose {
        schedule_to_close: attempt * 3,
        start_to_close: attempt,
    })
    .task_queue(queues::AGENT_RUNNER.to_owned())
    .heartbeat_timeout(Duration::from_secs(20))
    .retry_policy(
        RetryPolicy::builder()
            .maximum_attempts(2 + WORKER_LOSSES)
            .initial_interval(Duration::from_secs(10))
            .backoff_coefficient(2.0)
            .maximum_interval(Duration::from_secs(30))
            .non_retryable_error_types(
                [
                    errors::AGENT_TIMEOUT,
                    errors::BUDGET_EXCEEDED,
                    errors::INVALID_INPUT,
                ]
                .iter()
                .map(|s| (*s).to_owned()),
            )
            .build(),
    )
    .build()
}

/// The verify command: its failure is a result, not something to retry.
pub(super) fn verify(queue: &str, timeout_secs: u32) -> ActivityOptions {
    ActivityOptions::with_start_to_close_timeout(Duration::from_secs(u64::from(timeout_secs) + 60))
        .task_queue(queue.to_owned())
        .heartbeat_timeout(Duration::from_secs(30))
        .retry_policy(retry(1, 1, &[]))
        .build()
}
