//! Workspace templates: the fast path of create. Cloning costs git processes per
//! sandbox (measured: docs/performance.md); instead, one clone per (repository, commit)
//! is made once under `<state>/templates/` and each new workspace is a plain file copy
//! of it with the new branch written into `.git` (refs and HEAD are files). A sandbox can
//! change every file of its workspace without touching the template or another sandbox:
//! all are copies but git's object files, which with a uid per sandbox are shared
//! read-only ([`copy`]; git never changes one, it writes new ones).
//!
//! Local repositories whose `base_ref` can be read from their ref files without
//! running anything (HEAD, a branch, a full commit id) take this path, and remote ones
//! whose `base_ref` the remote names (`crate::local::storage::template::remote`, which says how a template
//! of a private repository is kept to its tenant); expressions like `HEAD~1` are cloned
//! as before. Templates are never shown to a sandbox, and a template of an older
//! commit is dropped when a newer one of the same owner is built (a remote one's once
//! unused for a while: [`build`]).
//! Past their size bound, least recently used templates are removed (`evict`).

use crate::{
    error::{ProvisionerError, Result},
    local::{
        base::{fs::remove_all, keyed_lock},
        isolation::uids,
        storage::{
            overlay,
            repo::{git, git_index},
        },
    },
};
use std::{
    collections::HashMap,
    io,
    os::unix::fs::DirBuilderExt,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::SystemTime,
};

#[cfg(test)]
use std::time::Duration;

mod branch;
mod build;
mod copy;
mod evict;
mod marks;
pub(crate) mod remote;
mod settle;
mod warm;
mod warm_copy;

pub(crate) use branch::start_branch;
use copy::copy_workspace;

pub use warm::WarmBounds;
pub(crate) use warm_copy::WarmCopy;

/// How long a remote repository's template of an older commit is kept after its last
/// use when a newer one is built (`crate::local::storage::template::remote`): as long as eviction spares it.
pub(crate) const SPARE: std::time::Duration = GRACE;

/// How long after its last use a template is spared by eviction (`evict`).
pub(crate) const GRACE: std::time::Duration = std::time::Duration::from_secs(600);

/// Builds that failed (`build`), by key: when they ended, and their error.
type Failures =
    std::sync::Mutex<std::collections::HashMap<String, (std::time::Instant, ProvisionerError)>>;

/// When each template was last used, by key (this replica's run).
pub(crate) type Used = Arc<Mutex<HashMap<String, SystemTime>>>;

pub(crate) struct Templates {
    pub(crate) root: PathBuf,
    /// One build at a time per template.
    building: keyed_lock::KeyedLock<String>,
    /// Sandboxes whose files are being made at once (their workspace copies above all):
    /// four per core (enough to overlap their waits on the disk), first come first
    /// served. A wave of a hundred creates copied all at once would share the cores a
    /// hundred ways: every copy would end near the last one, and the replica's async
    /// threads (its gRPC answers, health checks) would get a hundredth of the machine
    /// meanwhile.
    turns: tokio::sync::Semaphore,
    /// When each template was last used, by key (this replica's run).
    pub(crate) used: Used,
    /// The size bound in bytes (0: none).
    pub(crate) max_bytes: u64,
    /// One eviction at a time.
    pub(crate) evicting: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// Copies of the templates' workspaces made ahead of creates (`warm`).
    warm: Arc<warm::Warm>,
    /// Live overlay workspaces: a template that is one's lower layer is never evicted.
    pub(crate) overlays: Arc<overlay::Overlays>,
    /// Builds that failed lately (`build`).
    failures: Failures,
}

/// Give the template worktree `ws` its files' own mtimes and record them in its index
/// ([`settle`]), and in the indexes of the repositories at `nested` (its submodules',
/// relative to `ws`).
pub(crate) async fn settle(ws: &Path, nested: &[String]) -> Result<()> {
    settle::worktree(ws).map_err(|e| ProvisionerError::internal("settle template", e))?;
    git::refresh_index(ws).await?;
    for path in nested {
        git::refresh_index(&ws.join(path)).await?;
    }
    Ok(())
}

/// A template's copy in a new workspace.
pub(crate) struct Copied {
    /// The checksum of its index (`store::Record::made_index`).
    pub(crate) index: String,
    /// The sandbox uid it was given already (a warm copy's), now the sandbox's; 0: none.
    pub(crate) uid: u32,
}

impl Templates {
    pub(crate) fn open(root: PathBuf, max_bytes: u64) -> io::Result<Self> {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&root)?;
        // Builds interrupted by a crash, and the last run's warm copies.
        for e in std::fs::read_dir(&root)?.flatten() {
            if e.file_name().to_string_lossy().contains(".tmp-") {
                let _ = remove_all(&e.path());
            } else {
                warm::sweep(&e.path());
            }
        }
        let cores = std::thread::available_parallelism().map_or(2, usize::from);
        Ok(Self {
            root,
            building: keyed_lock::KeyedLock::default(),
            turns: tokio::sync::Semaphore::new(cores.max(2) * 4),
            used: Used::default(),
            max_bytes,
            evicting: std::sync::Arc::default(),
            warm: Arc::new(warm::Warm::start(WarmBounds::OFF, None)),
            overlays: Arc::default(),
            failures: Failures::default(),
        })
    }

    /// The live overlay workspaces, whose templates eviction spares; with `make`, warm
    /// copies are overlays too.
    #[must_use]
    pub(crate) fn with_overlays(mut self, overlays: Arc<overlay::Overlays>, make: bool) -> Self {
        if make {
            self.warm.make_overlays(overlays.clone());
        }
        self.overlays = overlays;
        self
    }

    /// Keep warm copies of the templates' workspaces within `bounds` (`warm`), each
    /// given to a uid of `uids` ahead of time when the replica hands uids out.
    #[must_use]
    pub(crate) fn with_warm(
        mut self,
        bounds: WarmBounds,
        uids: Option<Arc<uids::SandboxUids>>,
    ) -> Self {
        self.warm = Arc::new(warm::Warm::start(bounds, uids));
        self
    }

    /// One turn of the replica's file work for a sandbox (see [`Self::turns`]); the
    /// caller holds it while it makes the sandbox's directory, workspace, record and
    /// cgroups, so a create's file work is done at once, in arrival order.
    pub(crate) async fn turn(&self) -> Result<tokio::sync::SemaphorePermit<'_>> {
        self.turns
            .acquire()
            .await
            .map_err(|e| ProvisionerError::internal("wait for a create turn", e))
    }

    /// The replica's sandbox uids, if it hands them out.
    pub(crate) fn uids(&self) -> Option<&std::sync::Arc<uids::SandboxUids>> {
        self.warm.uids()
    }

    /// A warm copy of template `dir` renamed into place as the new sandbox's directory
    /// `sandbox_dir` (which must not exist), if one is ready; `None` otherwise (the
    /// caller makes the directory). Counts the create either way.
    pub(crate) async fn take(&self, dir: &Path, sandbox_dir: &Path) -> Option<WarmCopy> {
        let copy = self.warm.take(dir)?;
        let (warm, to) = (self.warm.clone(), sandbox_dir.to_path_buf());
        tokio::task::spawn_blocking(move || match std::fs::rename(&copy.path, &to) {
            Ok(()) => Some(copy),
            Err(e) => {
                warm.unusable(&copy, &e);
                None
            }
        })
        .await
        .ok()
        .flatten()
    }

    /// Make `ws` the workspace of template `dir` (from [`Self::ensure`]) on new branch
    /// `branch` at `commit`: `placed`'s (from [`Self::take`]; its workspace is `ws`
    /// already), else a copy made now. The caller holds a [`Self::turn`].
    pub(crate) async fn copy(
        &self,
        dir: PathBuf,
        ws: &Path,
        branch: &str,
        commit: &str,
        placed: Option<WarmCopy>,
    ) -> Result<Copied> {
        let (ws, branch, commit) = (ws.to_path_buf(), branch.to_owned(), commit.to_owned());
        // The sandbox's uid, claimed before its files are made: each is given to it as
        // it is made, not in a second walk of the copy.
        let made_ahead = placed.is_some();
        let held = match placed {
            Some(w) => w,
            None => WarmCopy::holding_uid(ws.clone(), self.warm.uids())?,
        };
        tokio::task::spawn_blocking(move || {
            let uid = held.uid();
            if !made_ahead {
                copy_workspace(&dir.join("workspace"), &ws, uid)
                    .map_err(|e| ProvisionerError::internal("copy template", e))?;
            }
            start_branch(&ws, &branch, &commit, uid)?;
            let (index, uid) = held.keep_uid();
            Ok(Copied {
                index: if made_ahead {
                    index
                } else {
                    git_index::checksum_of(&ws).unwrap_or_default()
                },
                uid,
            })
        })
        .await
        .map_err(|e| ProvisionerError::internal("copy template", e))?
    }

    /// Make `ws` a copy of the template of `repo` at `commit`, on new branch `branch`.
    #[cfg(test)]
    pub(crate) async fn workspace(
        &self,
        repo: &str,
        commit: &str,
        branch: &str,
        ws: &Path,
        timeout: Duration,
    ) -> Result<()> {
        let dir = self.ensure(repo, commit, timeout).await?;
        let _turn = self.turn().await?;
        self.copy(dir, ws, branch, commit, None).await.map(drop)
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod warm_tests;

#[cfg(test)]
mod copy_tests;
