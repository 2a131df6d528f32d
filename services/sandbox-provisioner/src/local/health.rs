//! Health checks of local sandboxes, and the replica-wide probe of the sandbox runtime
//! that vouches for them.

use crate::{
    error::{ProvisionerError, Result},
    local::{
        process::{Caps, Outcome},
        provisioner::Provisioner,
    },
};
use forkyard_proto::sandbox::v1::{HealthCheckRequest, HealthCheckResponse};
use std::{sync::Arc, time::Duration};
use tokio::sync::OwnedMutexGuard;
use tracing::warn;

const HEALTH_TIMEOUT: Duration = Duration::from_secs(30);
/// How long one command run inside a sandbox vouches for this replica's sandbox runtime
/// (bubblewrap, namespaces, cgroups) in the health checks of other sandboxes.
const RUNTIME_PROBE_INTERVAL: Duration = Duration::from_secs(10);
/// How long a successful probe still vouches while the next one runs: checks made
/// during a probe do not wait for it unless the last success is older than this.
const RUNTIME_PROBE_GRACE: Duration = Duration::from_secs(60);

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

    fn record(&self, ok: bool) {
        *self.last_ok.lock().expect("probe lock") = ok.then(std::time::Instant::now);
    }

    /// Whether this check may answer from the last probe, or must probe itself.
    async fn turn(&self) -> Turn {
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

enum Turn {
    Vouched(Duration),
    /// Answer from the last success (younger than the grace) and probe again in the
    /// background, holding the replica's one probe.
    Revalidate(Duration, OwnedMutexGuard<()>),
    /// Probe now, holding the replica's one probe.
    Probe(OwnedMutexGuard<()>),
}

fn vouched(age: Duration) -> HealthCheckResponse {
    HealthCheckResponse {
        healthy: true,
        detail: format!(
            "workspace present; sandbox runtime probed {} ms ago",
            age.as_millis()
        ),
    }
}

impl Provisioner {
    /// A local sandbox runs no process between commands, so its health is: its record
    /// is live, its workspace is on disk with its `.git`, and this replica can start a
    /// command in a sandbox at all. The last part runs `test -d /workspace/.git` inside
    /// this sandbox, at most once per [`RUNTIME_PROBE_INTERVAL`] for the whole replica:
    /// a fan-out of a hundred forks would otherwise start a hundred sandbox processes
    /// just to check the machinery the agents' own commands start right after.
    ///
    /// A probe older than the interval but younger than [`RUNTIME_PROBE_GRACE`] still
    /// vouches: the check that finds it so answers from it and probes again in the
    /// background, and the others answer from it meanwhile. Checks wait for a probe only
    /// when there is no such success (first checks of a replica, after a failed probe or
    /// a long idle time). Waiting there put a sandbox process, started while the wave's
    /// creates load the machine (about 50 ms), in front of the first sandbox of every
    /// wave that came more than the interval after the last.
    pub async fn health(self: &Arc<Self>, req: HealthCheckRequest) -> Result<HealthCheckResponse> {
        let entry = self.entry(&req.sandbox_id)?;
        let unhealthy = |detail: String| {
            warn!(sandbox_id = %req.sandbox_id, detail = %detail, "sandbox unhealthy");
            Ok(HealthCheckResponse {
                healthy: false,
                detail,
            })
        };
        if entry.record.lock().expect("record lock").destroying {
            return unhealthy("sandbox is being destroyed".into());
        }
        let git_dir = self.store.workspace(&req.sandbox_id).join(".git");
        if !tokio::fs::try_exists(&git_dir).await.unwrap_or(false) {
            return unhealthy("workspace has no .git on the host".into());
        }
        let probe = &self.runtime_probe;
        let _probing = match probe.turn().await {
            Turn::Vouched(age) => return Ok(vouched(age)),
            Turn::Revalidate(age, guard) => {
                let (this, id) = (Arc::clone(self), req.sandbox_id.clone());
                tokio::spawn(async move {
                    // A sandbox destroyed meanwhile proves nothing either way (an error).
                    if let Ok((healthy, detail)) = this.probe_inside(&id).await {
                        this.runtime_probe.record(healthy);
                        if !healthy {
                            warn!(sandbox_id = %id, detail = %detail, "sandbox runtime probe failed");
                        }
                    }
                    drop(guard);
                });
                return Ok(vouched(age));
            }
            Turn::Probe(guard) => guard,
        };
        let (healthy, detail) = self.probe_inside(&req.sandbox_id).await?;
        probe.record(healthy);
        if !healthy {
            warn!(sandbox_id = %req.sandbox_id, detail = %detail, "sandbox unhealthy");
        }
        Ok(HealthCheckResponse { healthy, detail })
    }

    /// Run `test -d /workspace/.git` inside the sandbox.
    async fn probe_inside(&self, sandbox_id: &str) -> Result<(bool, String)> {
        let argv = ["test", "-d", "/workspace/.git"].map(String::from);
        let caps = Caps {
            stdout: 4096,
            stderr: 4096,
            tail: false,
        };
        Ok(
            match self
                .run_in(sandbox_id, &argv, &[], HEALTH_TIMEOUT, caps)
                .await
            {
                Ok(f) => match f.outcome {
                    Outcome::Exited { code: 0 } => (
                        true,
                        format!(
                            "workspace visible inside, checked in {} ms",
                            f.duration.as_millis()
                        ),
                    ),
                    Outcome::Exited { code } => (
                        false,
                        format!("workspace check exited {code}: {}", f.stderr.lossy().trim()),
                    ),
                    Outcome::TimedOut | Outcome::Cancelled => {
                        (false, "workspace check did not finish".to_owned())
                    }
                },
                Err(e @ ProvisionerError::Internal(_)) => (false, e.to_string()),
                Err(e) => return Err(e),
            },
        )
    }
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
