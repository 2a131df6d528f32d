//! The repository inside an E2B sandbox, through envd: the clone at create (from the
//! bundle `seed` made on this host), the base commit, and the patch collected from it.

use super::{BASE_FILE, BUNDLE_FILE, E2bBackend, HOME, WORKSPACE, seed::Seed};
use crate::{
    backend::SandboxBackend,
    error::{ProvisionerError, Result},
    git,
    limits::{DEFAULT_PATCH_BYTES, MAX_PATCH_BYTES},
};
use forkyard_proto::sandbox::v1::{
    CollectPatchRequest, CollectPatchResponse, CreateSandboxRequest,
};
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

    /// The workspace cloned from `seed`'s bundle, uploaded through envd: its `origin`
    /// the repository's URL (which never carries a credential), on new branch
    /// `req.branch` at the seed's commit; the base commit recorded.
    pub(super) async fn clone_repo(
        &self,
        sid: &str,
        req: &CreateSandboxRequest,
        seed: &Seed,
    ) -> Result<String> {
        self.upload(sid, BUNDLE_FILE, &seed.bundle, seed.size)
            .await?;
        let argv: Vec<String> = [
            "git",
            "-c",
            "advice.detachedHead=false",
            "clone",
            "--quiet",
            "--",
            BUNDLE_FILE,
            WORKSPACE,
        ]
        .map(String::from)
        .to_vec();
        let env: HashMap<String, String> = git::sandbox_env().into_iter().collect();
        let r = self
            .run(sid, &argv, &env, HOME, self.config.clone_timeout, None)
            .await?;
        if r.exit_code != 0 || r.timed_out {
            return Err(ProvisionerError::Internal(format!(
                "git clone of the repository's bundle in the E2B sandbox {}: {}",
                if r.timed_out { "timed out" } else { "failed" },
                r.stderr.trim()
            )));
        }
        self.git(
            sid,
            &["remote", "set-url", "origin", &req.repo],
            "git remote",
        )
        .await?;
        if !req.branch.is_empty() {
            self.git(sid, &["checkout", "-q", "-b", &req.branch], "git checkout")
                .await?;
        }
        let base = self
            .git(sid, &["rev-parse", "HEAD"], "git rev-parse")
            .await?;
        let base = base.trim().to_owned();
        if base != seed.commit {
            return Err(ProvisionerError::internal(
                "clone the repository's bundle",
                format!("HEAD is {base}, not {}", seed.commit),
            ));
        }
        let rm = ["rm", "-f", BUNDLE_FILE].map(String::from).to_vec();
        self.run(
            sid,
            &rm,
            &HashMap::new(),
            HOME,
            self.config.request_timeout,
            None,
        )
        .await?;
        self.write_bytes(sid, BASE_FILE, base.as_bytes()).await?;
        Ok(base)
    }

    /// The workspace's changes since the base commit, as a binary patch.
    pub(super) async fn patch(&self, req: CollectPatchRequest) -> Result<CollectPatchResponse> {
        let sid = Self::e2b_id(&req.sandbox_id)?;
        let base = self.base_commit(sid).await?;
        let max = match req.max_bytes {
            0 => DEFAULT_PATCH_BYTES,
            n => n.min(MAX_PATCH_BYTES),
        };
        let diff = [
            "diff",
            "--cached",
            "--no-color",
            "--no-ext-diff",
            "--no-textconv",
        ];
        self.git(sid, &["add", "-A"], "git add").await?;
        let args: Vec<&str> = diff
            .iter()
            .copied()
            .chain(["--binary", &base, "--"])
            .collect();
        let patch = self.git(sid, &args, "git diff").await?;
        let args: Vec<&str> = diff
            .iter()
            .copied()
            .chain(["--numstat", &base, "--"])
            .collect();
        let numstat = self.git(sid, &args, "git diff --numstat").await?;
        let total = patch.len() as u64;
        let mut patch = patch;
        let truncated = total > max;
        if truncated {
            let mut cut = usize::try_from(max).unwrap_or(usize::MAX);
            while !patch.is_char_boundary(cut) {
                cut -= 1;
            }
            patch.truncate(cut);
        }
        Ok(CollectPatchResponse {
            patch,
            truncated,
            patch_bytes: total,
            diffstat: Some(git::parse_numstat(&numstat)),
            base_commit: base,
            usage: self.get(&req.sandbox_id).await.ok().and_then(|s| s.usage),
            // E2B's sandbox has a disk of its own size: nothing grows past a limit here.
            skipped_files: Vec::new(),
        })
    }
}
