//! Health checks and patch collection.

use crate::{
    error::{ProvisionerError, Result},
    git,
    process::{Caps, Outcome},
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
    /// One sandbox process does all of it ([`PATCH_SCRIPT`]): starting a sandbox costs
    /// more than the git commands in it, and this runs once per fork.
    pub async fn collect_patch(&self, req: CollectPatchRequest) -> Result<CollectPatchResponse> {
        let id = &req.sandbox_id;
        let base = self.entry(id)?.record().base_commit;
        let max = match req.max_bytes {
            0 => DEFAULT_PATCH_BYTES,
            n => n.min(MAX_PATCH_BYTES),
        };
        let argv: Vec<String> = [
            "sh",
            "-c",
            PATCH_SCRIPT,
            "forkyard-patch",
            "--cached",
            "--no-color",
            "--no-ext-diff",
            "--no-textconv",
            &base,
            "--",
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
        let caps = Caps {
            stdout: usize::try_from(max).unwrap_or(usize::MAX),
            stderr: NUMSTAT_BYTES,
        };
        let out = self
            .run_in(
                id,
                &argv,
                &git::sandbox_env(),
                self.config.exec_timeout,
                caps,
            )
            .await?;
        let stderr = out.stderr.lossy();
        match out.outcome {
            Outcome::Exited { code: 0 } => {}
            Outcome::Exited { code } => {
                let what = match code {
                    101 => "git add",
                    102 => "git diff --numstat",
                    _ => "git diff",
                };
                return Err(ProvisionerError::FailedPrecondition(format!(
                    "{what} in the sandbox failed: {}",
                    stderr.trim()
                )));
            }
            _ => {
                return Err(ProvisionerError::Internal(
                    "collecting the patch in the sandbox timed out".into(),
                ));
            }
        }
        Ok(CollectPatchResponse {
            truncated: out.stdout.truncated(),
            patch_bytes: out.stdout.total,
            patch: out.stdout.lossy(),
            diffstat: Some(git::parse_numstat(&stderr)),
            base_commit: base,
        })
    }
}

/// Stage everything, then the numstat and the binary patch of the index against the base
/// (`"$@"`: diff options, the base commit, `--`). The patch goes to stdout; the numstat
/// to stderr, after the patch, so no warning of git's is read as a numstat line; a
/// failed step exits 101 (add), 102 (numstat) or 103 (diff) with git's message on stderr.
const PATCH_SCRIPT: &str = r#"e=/tmp/.forkyard-git-err
git add -A 2>$e || { cat $e >&2; exit 101; }
git diff --numstat "$@" >/tmp/.forkyard-numstat 2>$e || { cat $e >&2; exit 102; }
git diff --binary "$@" 2>$e || { cat $e >&2; exit 103; }
cat /tmp/.forkyard-numstat >&2"#;

/// A numstat line per changed file: enough for any workspace the agent can produce.
const NUMSTAT_BYTES: usize = 16 * 1024 * 1024;
