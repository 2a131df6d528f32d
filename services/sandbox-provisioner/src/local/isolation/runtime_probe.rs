//! The replica-wide probe of the sandbox runtime (bubblewrap, namespaces, cgroups): one
//! command run inside a sandbox now and then vouches for the health checks of every
//! other, so a fan-out's checks do not each start a sandbox process.

use std::{sync::Arc, time::Duration};
use tokio::sync::OwnedMutexGuard;

/// How long one command run inside a sandbox vouches for this replica's sandbox runtime
/// (bubblewrap, namespaces, cgroups) in the health checks of other sandboxes.
pub(crate) const RUNTIME_PROBE_INTERVAL: Duration = Duration::from_secs(10);
/// How long a successful probe still vouches while the next one runs: checks made
/// during a probe do not wait for it unless the last success is older than this.
pub(crate) const RUNTIME_PROBE_GRACE: Duration = Duration::from_secs(60);

/// The runtime probe's state: when a probe last succeeded, and the probe itself (one at
/// a time per replica).
#[derive(Default)]
pub(crate) struct RuntimeProbe {
    last_ok: std::sync::Mutex<Option<std::time::Instant>>,
    running: Arc<tokio::sync::Mutex<()>>,
}

impl RuntimeProbe {
    fn age(&self) -> Option<Duration> {
        self.last_ok
            .lock()
            .expect("probe lock")
            .map(|at| at.elapsed())
    }

    pub(crate) fn record(&self, ok: bool) {
        *self.last_ok.lock().expect("probe lock") = ok.then(std::time::Instant::now);
    }

    /// Whether this check may answer from the last probe, or must probe itself.
    pub(crate) async fn turn(&self) -> Turn {
        match self.age() {
            Some(age) if age < RUNTIME_PROBE_INTERVAL => Turn::Vouched(age),
            Some(age) if age < RUNTIME_PROBE_GRACE => match self.running.clone().try_lock_owned() {
                Ok(guard) => Turn::Revalidate(age, guard),
                Err(_) => Turn::Vouched(age),
            },
            _ => {
                let guard = self.running.clone().lock_owned().await;
                // The probe this check waited for may have just succeeded.
                match self.age().filter(|a| *a < RUNTIME_PROBE_INTERVAL) {
                    Some(age) => Turn::Vouched(age),
                    None => Turn::Probe(guard),
                }
            }
        }
    }
}

pub(crate) enum Turn {
    Vouched(Duration),
    /// Answer from the last success (younger than the grace) and probe again in the
    /// background, holding the replica's one probe.
    Revalidate(Duration, OwnedMutexGuard<()>),
    /// Probe now, holding the replica's one probe.
    Probe(OwnedMutexGuard<()>),
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    fn probe_aged(age: Option<Duration>) -> RuntimeProbe {
        let p = RuntimeProbe::default();
        *p.last_ok.lock().unwrap() = age.map(|a| Instant::now() - a);
        p
    }

    #[tokio::test]
    async fn a_fresh_probe_vouches_and_a_stale_one_is_redone_by_one_check() {
        let p = probe_aged(Some(Duration::from_secs(1)));
        assert!(matches!(p.turn().await, Turn::Vouched(_)));
        let p = probe_aged(Some(Duration::from_secs(20)));
        let first = p.turn().await;
        assert!(
            matches!(first, Turn::Revalidate(a, _) if a >= Duration::from_secs(20)),
            "a stale probe still vouches and is redone in the background"
        );
        // While it runs, other checks answer from the last success instead of waiting.
        assert!(matches!(p.turn().await, Turn::Vouched(a) if a >= Duration::from_secs(20)));
    }

    #[tokio::test]
    async fn without_a_recent_success_checks_wait_for_the_probe() {
        let p = probe_aged(Some(RUNTIME_PROBE_GRACE + Duration::from_secs(1)));
        let Turn::Probe(guard) = p.turn().await else {
            panic!("an old success does not vouch")
        };
        let waiting = tokio::time::timeout(Duration::from_millis(100), p.turn()).await;
        assert!(
            waiting.is_err(),
            "a second check waits for the running probe"
        );
        // The probe succeeds: the waiting check then answers from it.
        p.record(true);
        drop(guard);
        assert!(matches!(p.turn().await, Turn::Vouched(_)));
        // A failed probe vouches for nothing: the next check probes again.
        p.record(false);
        assert!(matches!(p.turn().await, Turn::Probe(_)));
    }
}
