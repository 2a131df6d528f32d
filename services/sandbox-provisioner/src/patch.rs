//! Health checks and patch collection: both run inside the sandbox.

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

impl Provisioner {
    pub async fn health(&self, req: HealthCheckRequest) -> Result<HealthCheckResponse> {
        let argv = ["test", "-d", "/workspace/.git"].map(String::from);
        let caps = Caps {
            stdout: 4096,
            stderr: 4096,
        };
        let (healthy, detail) = match self
            .run_in(&req.sandbox_id, &argv, &[], HEALTH_TIMEOUT, caps)
            .await
        {
            Ok(f) => match f.outcome {
                Outcome::Exited { code: 0 } => (
                    true,
                    format!(
                        "workspace visible, checked in {} ms",
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
        };
        if !healthy {
            warn!(sandbox_id = %req.sandbox_id, detail = %detail, "sandbox unhealthy");
        }
        Ok(HealthCheckResponse { healthy, detail })
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
