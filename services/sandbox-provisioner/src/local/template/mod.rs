//! Workspace templates: the fast path of create. Cloning costs git processes per
//! sandbox (measured: docs/performance.md); instead, one clone per (repository, commit)
//! is made once under `<state>/templates/` and each new workspace is a plain file copy
//! of it with the new branch written into `.git` (refs and HEAD are files). A sandbox can
//! change every file of its workspace without touching the template or another sandbox:
//! all are copies but git's object files, which with a uid per sandbox are shared
//! read-only ([`copy`]; git never changes one, it writes new ones).
//!
//! Only local repositories whose `base_ref` can be read from their ref files without
//! running anything (HEAD, a branch, a full commit id) take this path; URLs and
//! expressions like `HEAD~1` are cloned as before. Templates are never shown to a
//! sandbox, and a template of an older commit is dropped when a newer one is built.
//! Past their size bound, least recently used templates are removed (`evict`).

use crate::{
    error::{ProvisionerError, Result},
    local::git,
};
use forkyard_common::git_refs::read_ref;
use std::{
    collections::HashMap,
    io,
    os::unix::fs::DirBuilderExt,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::{Duration, SystemTime},
};

mod copy;
mod evict;
mod settle;
mod warm;

use copy::copy_workspace;
pub(crate) use copy::{is_shared, is_shared_stat};

pub use warm::WarmBounds;
pub(crate) use warm::WarmCopy;

pub(crate) const READY: &str = "ready";
/// Present when the template's files have their own mtimes, recorded in its index
/// ([`settle`]); a template built before that is settled at its next use.
const SETTLED: &str = "settled";
/// The file holding a template's size in bytes, written when it is built.
pub(crate) const BYTES: &str = "bytes";

/// When each template was last used, by key (this replica's run).
pub(crate) type Used = Arc<Mutex<HashMap<String, SystemTime>>>;

pub(crate) struct Templates {
    pub(crate) root: PathBuf,
    /// One build at a time per template.
    building: crate::local::keyed_lock::KeyedLock<String>,
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
    pub(crate) overlays: Arc<crate::local::overlay::Overlays>,
}

/// `<hash of the repository>-<commit>`: the templates of one repository share a prefix.
fn key(repo: &str, commit: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in repo.bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    format!("{h:016x}-{commit}")
}

/// Give the template worktree `ws` its files' own mtimes and record them in its index
/// ([`settle`]).
async fn settle(ws: &Path) -> Result<()> {
    settle::worktree(ws).map_err(|e| ProvisionerError::internal("settle template", e))?;
    git::refresh_index(ws).await
}

/// Start `branch` at `commit` in a copied workspace: what `git checkout -b` writes
/// (the reflog aside). What it makes (the ref, directories of a branch like `team/x`)
/// is given to `uid`, or git in the sandbox could not update its own branch.
pub(crate) fn start_branch(ws: &Path, branch: &str, commit: &str, uid: Option<u32>) -> Result<()> {
    let git = ws.join(".git");
    let refs = git.join("refs/heads");
    if read_ref(&git, &format!("refs/heads/{branch}"), 0).is_some() {
        return Err(ProvisionerError::FailedPrecondition(format!(
            "cannot create branch {branch}: a branch named '{branch}' already exists"
        )));
    }
    // A ref cannot also be a directory of refs: `main/x` beside `main` (packed or not),
    // or `x` beside `x/y`, as `git checkout -b` refuses (git would fail later, at gc).
    let clash = branch
        .match_indices('/')
        .map(|(i, _)| &branch[..i])
        .find(|prefix| read_ref(&git, &format!("refs/heads/{prefix}"), 0).is_some())
        .map(|prefix| format!("refs/heads/{prefix}"))
        .or_else(|| {
            let under = format!(" refs/heads/{branch}/");
            let packed = std::fs::read_to_string(git.join("packed-refs")).unwrap_or_default();
            (refs.join(branch).is_dir() || packed.lines().any(|l| l.contains(&under)))
                .then(|| format!("refs/heads/{branch}/..."))
        });
    if let Some(existing) = clash {
        return Err(ProvisionerError::FailedPrecondition(format!(
            "cannot create branch {branch}: '{existing}' exists"
        )));
    }
    let file = refs.join(branch);
    let write = || -> io::Result<()> {
        let mut dir = refs.clone();
        for part in Path::new(branch)
            .parent()
            .into_iter()
            .flat_map(Path::components)
        {
            dir.push(part);
            match std::fs::DirBuilder::new().mode(0o755).create(&dir) {
                Ok(()) => give(&dir, uid)?,
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(e),
            }
        }
        // A warm copy's empty ref file, made ahead, becomes the branch's.
        let made_ahead = refs.join(warm::BRANCH_FILE);
        match std::fs::OpenOptions::new().write(true).open(&made_ahead) {
            Ok(mut f) => {
                io::Write::write_all(&mut f, format!("{commit}\n").as_bytes())?;
                std::fs::rename(&made_ahead, &file)?;
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                std::fs::write(&file, format!("{commit}\n"))?;
                give(&file, uid)?;
            }
            Err(e) => return Err(e),
        }
        rewrite(
            &git.join("HEAD"),
            format!("ref: refs/heads/{branch}\n").as_bytes(),
        )
    };
    write().map_err(|e| ProvisionerError::internal("start branch", e))
}

fn give(path: &Path, uid: Option<u32>) -> io::Result<()> {
    uid.map_or(Ok(()), |uid| crate::local::uids::chown(path, uid))
}

/// A template's copy in a new workspace.
pub(crate) struct Copied {
    /// The checksum of its index (`store::Record::made_index`).
    pub(crate) index: String,
    /// The sandbox uid it was given already (a warm copy's), now the sandbox's; 0: none.
    pub(crate) uid: u32,
}

/// Overwrite `path` with `content` in place (`store::write_in_place`), or make it.
fn rewrite(path: &Path, content: &[u8]) -> io::Result<()> {
    match crate::local::store::write_in_place(path, content) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => std::fs::write(path, content),
        done => done,
    }
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
                let _ = crate::local::store::remove_all(&e.path());
            } else {
                warm::sweep(&e.path());
            }
        }
        let cores = std::thread::available_parallelism().map_or(2, usize::from);
        Ok(Self {
            root,
            building: crate::local::keyed_lock::KeyedLock::default(),
            turns: tokio::sync::Semaphore::new(cores.max(2) * 4),
            used: Used::default(),
            max_bytes,
            evicting: std::sync::Arc::default(),
            warm: Arc::new(warm::Warm::start(WarmBounds::OFF, None)),
            overlays: Arc::default(),
        })
    }

    /// The live overlay workspaces, whose templates eviction spares; with `make`, warm
    /// copies are overlays too.
    #[must_use]
    pub(crate) fn with_overlays(
        mut self,
        overlays: Arc<crate::local::overlay::Overlays>,
        make: bool,
    ) -> Self {
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
        uids: Option<Arc<crate::local::uids::SandboxUids>>,
    ) -> Self {
        self.warm = Arc::new(warm::Warm::start(bounds, uids));
        self
    }

    /// The ready template of `repo` at `commit`, built now if needed.
    pub(crate) async fn ensure(
        &self,
        repo: &str,
        commit: &str,
        timeout: Duration,
    ) -> Result<PathBuf> {
        let key = key(repo, commit);
        let dir = self.root.join(&key);
        self.touch(&key);
        // A built template is settled before it is renamed into place (or after, once,
        // when an older provisioner built it): the marker alone says it is usable.
        if dir.join(SETTLED).is_file() {
            return Ok(dir);
        }
        let _held = self.building.lock(key.clone()).await;
        if dir.join(SETTLED).is_file() {
            return Ok(dir);
        }
        if dir.join(READY).is_file() {
            settle(&dir.join("workspace")).await?;
            std::fs::write(dir.join(SETTLED), "")
                .map_err(|e| ProvisionerError::internal("settle template", e))?;
            return Ok(dir);
        }
        let tmp = self
            .root
            .join(format!("{key}.tmp-{}", uuid::Uuid::new_v4().simple()));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&tmp)
            .map_err(|e| ProvisionerError::internal("create template", e))?;
        let ws = tmp.join("workspace");
        let built = match git::clone_detached(repo, commit, &ws, timeout).await {
            Ok(()) => settle(&ws).await,
            Err(e) => Err(e),
        };
        if let Err(e) = built {
            let _ = crate::local::store::remove_all(&tmp);
            return Err(e);
        }
        let bytes = crate::local::store::disk_usage(&tmp);
        let done = std::fs::write(tmp.join(BYTES), bytes.to_string())
            .and_then(|()| std::fs::write(tmp.join(SETTLED), ""))
            .and_then(|()| std::fs::write(tmp.join(READY), commit))
            .and_then(|()| std::fs::rename(&tmp, &dir));
        if let Err(e) = done {
            let _ = crate::local::store::remove_all(&tmp);
            return Err(ProvisionerError::internal("store template", e));
        }
        // Older commits of the same repository are not needed any more, unless a live
        // sandbox's overlay has one as its lower layer (eviction takes it later).
        let prefix = &key[..17];
        for e in std::fs::read_dir(&self.root)
            .into_iter()
            .flatten()
            .flatten()
        {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with(prefix)
                && name != key
                && !name.contains(".tmp-")
                && !self.overlays.uses(&e.path())
            {
                self.warm.forget(&e.path());
                // Out of the templates' names first, at once (a `.tmp-` name, swept at
                // start-up): the warm copy thread may still be writing a copy into it,
                // and a removal that failed midway left a template without its marker
                // that nothing would ever remove.
                let gone = self
                    .root
                    .join(format!("{name}.tmp-old-{}", uuid::Uuid::new_v4().simple()));
                if std::fs::rename(e.path(), &gone).is_ok() {
                    let _ = crate::local::store::remove_all(&gone);
                }
            }
        }
        self.evict_in_the_background();
        Ok(dir)
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
    pub(crate) fn uids(&self) -> Option<&std::sync::Arc<crate::local::uids::SandboxUids>> {
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
                    crate::local::git_index::checksum_of(&ws).unwrap_or_default()
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
