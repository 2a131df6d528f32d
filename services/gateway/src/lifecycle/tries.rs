//! The one retry table of a fork's last steps. The child workflow's local activities
//! take their Temporal retry policies from it (`workflows::options`), and the gateway's
//! finish activity, which makes the same calls itself for a batch of inline forks, its
//! retries (`activities::retry::retried`): a step is tried as often, as far apart and
//! for as long whichever path runs it. Which failures are final is the called service's
//! own classification, read the same way on both paths.

use forkyard_proto::activities::errors;
use std::time::Duration;

/// How a step is tried: up to `attempts` times (0: until `within` has passed since the
/// first try), waiting `first`, then twice as long each time (up to `longest`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tries {
    pub attempts: u32,
    pub first: Duration,
    pub longest: Option<Duration>,
    pub within: Option<Duration>,
    /// Error types never tried again (besides those their service marks final).
    pub never: &'static [&'static str],
}

/// What no step retries: bad input, a thing that is not there, a refused credential,
/// a spent budget.
pub const FINAL: &[&str] = &[
    errors::INVALID_INPUT,
    errors::NOT_FOUND,
    errors::SANDBOX_AUTH,
    errors::BUDGET_EXCEEDED,
];

/// How long a fork's sandbox destroy is tried (its owner replica down or restarting)
/// before the sandbox is left to the janitor, whose sweep reaps it once its workflow
/// has closed. Within the finish activity's start-to-close (`workflows::options::finish`,
/// 720 s), which heartbeats meanwhile.
pub const CLEANUP_DEADLINE: Duration = Duration::from_secs(300);

/// Collect a fork's patch: 3×, 2 s apart and doubling (the seed's cleanup policy).
pub const PATCH: Tries = Tries::times(3, 2, FINAL);

/// A ledger call (open an account, settle a reservation): 5×, from 1 s, doubling.
pub const LEDGER: Tries = Tries::times(5, 1, FINAL);

/// A settlement the ledger did not take in time (it was down or slow), posted again
/// durably: at most a minute apart for up to a week, since spend that happened must be
/// posted. The idempotency key is the first try's: it is posted once.
pub const SETTLE_DURABLY: Tries = Tries {
    attempts: 0,
    first: Duration::from_secs(1),
    longest: Some(Duration::from_secs(60)),
    within: Some(Duration::from_secs(7 * 24 * 3600)),
    never: FINAL,
};

/// Destroy a fork's sandbox: for [`CLEANUP_DEADLINE`], from 2 s doubling to 30 s apart.
/// A provisioner restarting or away for a minute must not leave the sandbox behind.
pub const DESTROY: Tries = Tries {
    attempts: 0,
    first: Duration::from_secs(2),
    longest: Some(Duration::from_secs(30)),
    within: Some(CLEANUP_DEADLINE),
    never: &[errors::INVALID_INPUT],
};

/// Destroy a sandbox already lost (its replica did not answer, or no longer has it; the
/// fork starts again elsewhere): 3×, 2 s apart and doubling, as before cleanup outlasted
/// outages. The run must not wait minutes for a replica that is gone; the janitor reaps
/// what is left once the replica is back.
pub const DESTROY_LOST: Tries = Tries::times(3, 2, &[errors::INVALID_INPUT]);

impl Tries {
    const fn times(attempts: u32, first_secs: u64, never: &'static [&'static str]) -> Self {
        Self {
            attempts,
            first: Duration::from_secs(first_secs),
            longest: None,
            within: None,
            never,
        }
    }

    /// The wait after `wait`.
    pub fn next_wait(&self, wait: Duration) -> Duration {
        let doubled = wait * 2;
        self.longest.map_or(doubled, |l| doubled.min(l))
    }

    /// How long the step is tried at most, counting the waits between its tries (for
    /// its error: "tried for … s").
    pub fn span(&self) -> Duration {
        if let Some(within) = self.within {
            return within;
        }
        let mut wait = self.first;
        let mut total = Duration::ZERO;
        for _ in 1..self.attempts {
            total += wait;
            wait = self.next_wait(wait);
        }
        total
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lost_sandbox_is_tried_for_six_seconds_any_other_until_the_cleanup_deadline() {
        assert_eq!(DESTROY_LOST.span(), Duration::from_secs(6));
        assert_eq!(DESTROY.span(), CLEANUP_DEADLINE);
        assert_eq!(LEDGER.span(), Duration::from_secs(1 + 2 + 4 + 8));
    }
}
