//! The repository inside an E2B sandbox, through envd: the clone at create and the base commit.

use super::{BASE_FILE, E2bBackend, HOME, WORKSPACE};
use crate::{
    error::{ProvisionerError, Result},
    git,
};
use forkyard_proto::sandbox::v1::CreateSandboxRequest;
use std::collections::HashMap;

impl E2bBackend {
    /// `git` in the workspace; a non-zero exit is an error naming `what`.
    pub(super) async fn git(&self, sid: &str, args: &[&str], what: &str) -> Result<String> {
        let argv: Vec<String> = std::iter::once("git")
            .chain(args.iter().copied())
            .map(String::from)
            .collect();
        let env: HashMap<String, String> = git::sandbox_env().into_iter().collect();
        let r = self
            .run(sid, &argv, &env, WORKSPACE, self.config.exec_timeout, None)
            .await?;
        if r.exit_code != 0 || r.timed_out {
            return Err(ProvisionerError::FailedPrecondition(format!(
                "{what} in the sandbox exited {}: {}",
                r.exit_code,
                r.stderr.trim()
            )));
        }
        Ok(r.stdout)
    }

    pub(super) async fn base_commit(&self, sid: &str) -> Result<String> {
        if let Some(k) = self.known(sid)
            && !k.base_commit.is_empty()
        {
            return Ok(k.base_commit);
        }
        let base = self
            .read_bytes(sid, BASE_FILE)
            .await
            .map(|b| String::from_utf8_lossy(&b).trim().to_owned())?;
        Ok(base)
    }

    pub(super) async fn clone_repo(&self, sid: &str, req: &CreateSandboxRequest) -> Result<String> {
        let mut argv: Vec<String> = ["git", "clone", "--quiet"].map(String::from).to_vec();
        if !req.base_ref.is_empty() {
            argv.extend(["--branch".into(), req.base_ref.clone()]);
        }
        argv.extend(["--".into(), req.repo.clone(), WORKSPACE.into()]);
        let env: HashMap<String, String> = git::sandbox_env().into_iter().collect();
        let r = self
            .run(sid, &argv, &env, HOME, self.config.clone_timeout, None)
            .await?;
        if r.exit_code != 0 || r.timed_out {
            return Err(ProvisionerError::RepoUnavailable(format!(
                "git clone {} in the E2B sandbox {}: {}",
                req.repo,
                if r.timed_out { "timed out" } else { "failed" },
                r.stderr.trim()
            )));
        }
        if !req.branch.is_empty() {
            self.git(sid, &["checkout", "-q", "-b", &req.branch], "git checkout")
                .await?;
        }
        let base = self
            .git(sid, &["rev-parse", "HEAD"], "git rev-parse")
            .await?;
        let base = base.trim().to_owned();
        self.write_bytes(sid, BASE_FILE, base.as_bytes()).await?;
        Ok(base)
    }
}
