//! Health checks of local sandboxes, vouched for by the replica-wide probe of the
//! sandbox runtime (`crate::local::isolation::runtime_probe`).

use crate::{
    error::{ProvisionerError, Result},
    local::{
        core::provisioner::Provisioner,
        isolation::{
            command::process::{Caps, Outcome},
            runtime_probe::Turn,
        },
    },
};
use forkyard_proto::sandbox::v1::{HealthCheckRequest, HealthCheckResponse};
use std::{sync::Arc, time::Duration};
use tracing::warn;

const HEALTH_TIMEOUT: Duration = Duration::from_secs(30);
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
    /// this sandbox, at most once per `RUNTIME_PROBE_INTERVAL` (`runtime_probe`) for the
    /// whole replica: a fan-out of a hundred forks would otherwise start a hundred
    /// sandbox processes just to check the machinery the agents' own commands start
    /// right after.
    ///
    /// A probe older than the interval but younger than `RUNTIME_PROBE_GRACE` still
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
        let ws = self.storage.store.workspace(&req.sandbox_id);
        if !tokio::fs::try_exists(ws.join(".git"))
            .await
            .unwrap_or(false)
        {
            return unhealthy("workspace has no .git on the host".into());
        }
        let probe = &self.isolation.runtime_probe;
        let _probing = match probe.turn().await {
            Turn::Vouched(age) => return Ok(vouched(age)),
            Turn::Revalidate(age, guard) => {
                let (this, id) = (Arc::clone(self), req.sandbox_id.clone());
                tokio::spawn(async move {
                    // A sandbox destroyed meanwhile proves nothing either way (an error).
                    if let Ok((healthy, detail)) = this.probe_inside(&id).await {
                        this.isolation.runtime_probe.record(healthy);
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
                .run_in(sandbox_id, &argv, &[], None, HEALTH_TIMEOUT, caps)
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
