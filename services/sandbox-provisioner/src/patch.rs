//! Health checks and patch collection.

use crate::{
    error::{ProvisionerError, Result},
    git,
    process::{Caps, Finished, Outcome},
    provisioner::{DEFAULT_PATCH_BYTES, MAX_PATCH_BYTES, Provisioner},
};
use forkyard_proto::sandbox::v1::{
    CollectPatchRequest, CollectPatchResponse, HealthCheckRequest, HealthCheckResponse,
};
use std::time::Duration;
use tracing::warn;

const HEALTH_TIMEOUT: Duration = Duration::from_secs(30);
/// How long one command run inside a sandbox vouches for this replica's sandbox runtime
/// (bubblewrap, namespaces, cgroups) in the health checks of other sandboxes.
const RUNTIME_PROBE_INTERVAL: Duration = Duration::from_secs(10);

impl Provisioner {
    /// A local sandbox runs no process between commands, so its health is: its record
    /// is live, its workspace is on disk with its `.git`, and this replica can start a
    /// command in a sandbox at all. The last part runs `test -d /workspace/.git` inside
    /// this sandbox, at most once per [`RUNTIME_PROBE_INTERVAL`] for the whole replica
    /// (concurrent checks wait for one probe): a fan-out of a hundred forks would
    /// otherwise start a hundred sandbox processes just to check the machinery the
    /// agents' own commands start right after.
    pub async fn health(&self, req: HealthCheckRequest) -> Result<HealthCheckResponse> {
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
        let mut last_probe = self.runtime_probe.lock().await;
        if let Some(at) = *last_probe
            && at.elapsed() < RUNTIME_PROBE_INTERVAL
        {
            return Ok(HealthCheckResponse {
                healthy: true,
                detail: format!(
                    "workspace present; sandbox runtime probed {} ms ago",
                    at.elapsed().as_millis()
                ),
            });
        }
        let (healthy, detail) = self.probe_inside(&req.sandbox_id).await?;
        if healthy {
            *last_probe = Some(std::time::Instant::now());
        } else {
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

    /// The workspace's changes against the base commit, computed by git inside the
    /// sandbox (the agent controls the repository: its hooks and config never run here).
    pub async fn collect_patch(&self, req: CollectPatchRequest) -> Result<CollectPatchResponse> {
        let id = &req.sandbox_id;
        let base = self.entry(id)?.record().base_commit;
        let max = match req.max_bytes {
            0 => DEFAULT_PATCH_BYTES,
            n => n.min(MAX_PATCH_BYTES),
        };
        let env = git::sandbox_env();
        let timeout = self.config.exec_timeout;
        let git = |args: &[&str]| -> Vec<String> {
            std::iter::once("git")
                .chain(args.iter().copied())
                .map(String::from)
                .collect()
        };
        let small = Caps {
            stdout: 64 * 1024,
            stderr: 64 * 1024,
        };
        let diff = [
            "diff",
            "--cached",
            "--no-color",
            "--no-ext-diff",
            "--no-textconv",
        ];

        let staged = self
            .run_in(id, &git(&["add", "-A"]), &env, timeout, small)
            .await?;
        check_git(&staged, "git add")?;
        let patch_args: Vec<&str> = diff
            .iter()
            .copied()
            .chain(["--binary", &base, "--"])
            .collect();
        let caps = Caps {
            stdout: usize::try_from(max).unwrap_or(usize::MAX),
            stderr: 64 * 1024,
        };
        let patch = self
            .run_in(id, &git(&patch_args), &env, timeout, caps)
            .await?;
        check_git(&patch, "git diff")?;
        let numstat_args: Vec<&str> = diff
            .iter()
            .copied()
            .chain(["--numstat", &base, "--"])
            .collect();
        let caps = Caps {
            stdout: 16 * 1024 * 1024,
            stderr: 64 * 1024,
        };
        let numstat = self
            .run_in(id, &git(&numstat_args), &env, timeout, caps)
            .await?;
        check_git(&numstat, "git diff --numstat")?;

        Ok(CollectPatchResponse {
            truncated: patch.stdout.truncated(),
            patch_bytes: patch.stdout.total,
            patch: patch.stdout.lossy(),
            diffstat: Some(git::parse_numstat(&numstat.stdout.lossy())),
            base_commit: base,
        })
    }
}

fn check_git(f: &Finished, what: &str) -> Result<()> {
    match f.outcome {
        Outcome::Exited { code: 0 } => Ok(()),
        Outcome::Exited { code } => Err(ProvisionerError::FailedPrecondition(format!(
            "{what} in the sandbox exited {code}: {}",
            f.stderr.lossy().trim()
        ))),
        _ => Err(ProvisionerError::Internal(format!(
            "{what} in the sandbox timed out"
        ))),
    }
}
