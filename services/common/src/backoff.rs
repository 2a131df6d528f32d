//! The mesh's one way to wait between tries: doubling from a first wait up to a longest,
//! each wait jittered to between one and two times its step (backon's exponential
//! backoff with jitter). Without jitter, callers that failed together — a run's forks
//! on a replica that restarted, every pod of a Deployment waiting for Temporal — try
//! again together, in step, at every doubling.

use backon::{BackoffBuilder, ExponentialBuilder};
use std::time::Duration;

/// Waits for as many tries as asked for: the `n`th between `first·2ⁿ` (at most
/// `longest`) and twice that. Endless; a caller bounds it by attempts or by time.
pub fn doubling(first: Duration, longest: Option<Duration>) -> impl Iterator<Item = Duration> {
    let builder = ExponentialBuilder::default()
        .with_min_delay(first)
        .with_factor(2.0)
        .with_jitter()
        .without_max_times();
    let builder = match longest {
        Some(l) => builder.with_max_delay(l),
        None => builder.without_max_delay(),
    };
    builder.build()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_wait_is_its_doubling_step_to_twice_that_and_callers_spread_out() {
        let (first, longest) = (Duration::from_millis(100), Duration::from_millis(800));
        let steps = [100, 200, 400, 800, 800, 800];
        let a: Vec<Duration> = doubling(first, Some(longest)).take(6).collect();
        for (wait, step) in a.iter().zip(steps) {
            let step = Duration::from_millis(step);
            assert!(*wait >= step && *wait <= step * 2, "{wait:?} for {step:?}");
        }
        // Two callers that failed together do not wait alike.
        let b: Vec<Duration> = doubling(first, Some(longest)).take(6).collect();
        assert_ne!(a, b, "no jitter");
        assert_eq!(doubling(first, None).take(100).count(), 100, "endless");
    }
}
