//! The repository an E2B sandbox starts from, fetched on this host rather than in the
//! sandbox: the sandbox never holds a credential, and a run's forks fetch it once.
//!
//! The repository is admitted as a local create admits it (no credentials in the URL,
//! its host allowed, a local path outside the provisioner's data) and read as the local
//! backend reads it (`crate::local::api::workspace`): the workspace template of the
//! tenant, repository and commit when there can be one (a remote repository's is asked
//! of the remote with the tenant's credential at each create, then built once and
//! shared by the run's forks: `crate::local::storage::template::remote`), else a clone
//! for this create alone. Public repositories take the same path: one fetch on the host
//! instead of one per sandbox, and no network needed in the sandbox for it.
//!
//! What the sandbox is given is a git bundle of the base commit's history with the one
//! ref `HEAD` (objects and a ref: no configuration, remote URL or credential), made
//! once per template (`e2b.bundle` beside its workspace) and bounded in size
//! (`--e2b-bundle-max-bytes`). A repository with submodules is refused: the local
//! backend checks them out with the tenant's credentials, and a bundle of the
//! superproject alone would be a partial checkout the agent cannot tell from a whole.

use super::E2bBackend;
use crate::{
    error::{ProvisionerError, Result},
    git::host_git,
    local::{
        api::workspace::Source,
        core::provisioner::Provisioner,
        storage::{layout::WORKSPACE, repo::git},
    },
};
use forkyard_proto::sandbox::v1::CreateSandboxRequest;
use std::path::{Path, PathBuf};

/// A template's bundle, beside its workspace.
const TEMPLATE_BUNDLE: &str = "e2b.bundle";
/// Where creates whose repository has no template clone it (`<state>/e2b-seeds`).
const SCRATCH: &str = "e2b-seeds";

/// A repository's bundle ready for a sandbox.
pub(super) struct Seed {
    pub(super) bundle: PathBuf,
    pub(super) size: u64,
    /// The base commit: the bundle's `HEAD`.
    pub(super) commit: String,
    /// A clone made for this create alone, removed with the seed.
    _scratch: Option<Scratch>,
}

/// A directory removed when dropped.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Remove what creates of an earlier run of the provisioner left.
pub(super) fn sweep(local: &Provisioner) {
    let _ = std::fs::remove_dir_all(local.config.state_dir.join(SCRATCH));
}

impl E2bBackend {
    /// `req`'s repository admitted (`req.repo` made canonical) and fetched on this host
    /// with the tenant's credential, as a bundle for the sandbox.
    pub(super) async fn seed(&self, req: &mut CreateSandboxRequest) -> Result<Seed> {
        req.repo = self.local.admit_repo(&req.repo)?;
        match self.local.workspace_source(req).await? {
            Source::Template(dir, commit) => self.template_seed(&dir, commit).await,
            Source::Clone => self.clone_seed(req).await,
        }
    }

    /// The bundle of template `dir` (made now if it has none yet).
    async fn template_seed(&self, dir: &Path, commit: String) -> Result<Seed> {
        let ws = dir.join(WORKSPACE);
        refuse_submodules(&ws)?;
        let bundle = dir.join(TEMPLATE_BUNDLE);
        let _one = self.bundling.lock(bundle.clone()).await;
        if !bundle.exists() {
            let tmp = dir.join(format!(
                "{TEMPLATE_BUNDLE}.tmp-{}",
                uuid::Uuid::new_v4().simple()
            ));
            let made = make_bundle(&ws, &tmp, self.config.clone_timeout).await;
            let made = made.and_then(|()| {
                std::fs::rename(&tmp, &bundle)
                    .map_err(|e| ProvisionerError::internal("keep the repository's bundle", e))
            });
            if made.is_err() {
                let _ = std::fs::remove_file(&tmp);
            }
            made?;
        }
        self.bounded(bundle, commit, None)
    }

    /// A clone of `req`'s repository on this host for this create alone (its base_ref
    /// is one only a clone resolves), and its bundle.
    async fn clone_seed(&self, req: &CreateSandboxRequest) -> Result<Seed> {
        let dir = self
            .local
            .config
            .state_dir
            .join(SCRATCH)
            .join(uuid::Uuid::new_v4().simple().to_string());
        std::fs::create_dir_all(&dir)
            .map_err(|e| ProvisionerError::internal("make a scratch directory", e))?;
        let scratch = Scratch(dir.clone());
        let reach = self.local.reader(&req.tenant).reach(&req.repo).await?;
        let ws = dir.join(WORKSPACE);
        let timeout = self.config.clone_timeout;
        let branch = if req.branch.is_empty() {
            "forkyard-base"
        } else {
            &req.branch
        };
        let commit = git::clone(
            &req.repo,
            &req.base_ref,
            branch,
            &ws,
            timeout,
            reach.as_ref(),
        )
        .await?;
        refuse_submodules(&ws)?;
        let bundle = dir.join("repo.bundle");
        make_bundle(&ws, &bundle, timeout).await?;
        self.bounded(bundle, commit, Some(scratch))
    }

    fn bounded(&self, bundle: PathBuf, commit: String, scratch: Option<Scratch>) -> Result<Seed> {
        let size = std::fs::metadata(&bundle)
            .map_err(|e| ProvisionerError::internal("read the repository's bundle", e))?
            .len();
        let max = self.config.bundle_max_bytes;
        if size > max {
            return Err(ProvisionerError::FailedPrecondition(format!(
                "the repository's history is a {size}-byte git bundle; an e2b sandbox is given at most {max} (--e2b-bundle-max-bytes, FORKYARD_E2B_BUNDLE_MAX_BYTES)"
            )));
        }
        Ok(Seed {
            bundle,
            size,
            commit,
            _scratch: scratch,
        })
    }
}

/// A workspace whose repository has submodules cannot be given whole as one bundle.
fn refuse_submodules(ws: &Path) -> Result<()> {
    if ws.join(".gitmodules").exists() {
        return Err(ProvisionerError::invalid(
            "repo",
            "has submodules (.gitmodules), which the e2b backend does not check out: run it on the local backend",
        ));
    }
    Ok(())
}

/// `git bundle create` of `ws`'s `HEAD` and its history into `to`.
async fn make_bundle(ws: &Path, to: &Path, timeout: std::time::Duration) -> Result<()> {
    let mut cmd = host_git();
    cmd.arg("-C")
        .arg(ws)
        .args(["bundle", "create", "--quiet"])
        .arg(to)
        .arg("HEAD");
    git::run(cmd, timeout)
        .await?
        .map(drop)
        .map_err(|e| ProvisionerError::internal("git bundle", e))
}
