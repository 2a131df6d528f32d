//! A template built once per key, however many creates ask for it at once: the first
//! builds it under the key's lock, the others wait on the lock and then find it ready,
//! or, when the build they waited for failed, get its error (they would have asked the
//! same repository the same thing a moment later: a hundred creates of a run on a
//! repository that cannot be read must not clone it a hundred times, one after another).

use super::{
    Templates,
    marks::{BYTES, READY, SETTLED},
    settle,
};
use crate::{
    error::{ProvisionerError, Result},
    local::{
        base::fs::remove_all,
        storage::{repo::git, store},
    },
};
use sha2::Digest as _;
use std::{
    future::Future,
    os::unix::fs::DirBuilderExt,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

/// How long a failed build's error is kept for the creates that waited on it.
const FAILURE_KEPT: Duration = Duration::from_secs(600);

/// `<hash of the owner>-<commit>`: the templates of one owner (a local repository's
/// path; a tenant and a remote repository's URL) share a prefix. A cryptographic hash:
/// owners are named by callers, and two that collided would share their templates.
fn key(owner: &str, commit: &str) -> String {
    let hash = sha2::Sha256::digest(owner.as_bytes());
    let hex: String = hash[..16].iter().map(|b| format!("{b:02x}")).collect();
    format!("{hex}-{commit}")
}

/// The part of [`key`] that names the owner.
fn owner_prefix(key: &str) -> &str {
    &key[..=32]
}

impl Templates {
    /// The ready template of local repository `repo` at `commit`, built now if needed.
    pub(crate) async fn ensure(
        &self,
        repo: &str,
        commit: &str,
        timeout: Duration,
    ) -> Result<PathBuf> {
        let build = |dir: PathBuf| async move {
            let ws = dir.join("workspace");
            git::clone_detached(repo, commit, &ws, timeout, None).await?;
            settle(&ws, &[]).await
        };
        self.ensure_with(repo, commit, Duration::ZERO, build)
            .await
            .map(|(dir, _)| dir)
    }

    /// The ready template of `owner` at `commit`, `build` into a new directory (its
    /// `workspace` made and settled) if there is none yet; with whether it was built
    /// since this call asked (by it, or by the call it waited for). Once it is built,
    /// the templates of the same owner's other commits are dropped, but for those used
    /// in the last `spare` (another run's, on another branch, that would build its
    /// own again at its next create).
    pub(crate) async fn ensure_with<F, Fut>(
        &self,
        owner: &str,
        commit: &str,
        spare: Duration,
        build: F,
    ) -> Result<(PathBuf, bool)>
    where
        F: FnOnce(PathBuf) -> Fut,
        Fut: Future<Output = Result<()>>,
    {
        // The commit names a directory: it may come from a remote's answer.
        if !git::is_commit_id(commit) {
            return Err(ProvisionerError::internal(
                "workspace template",
                format!("{commit:?} is not a commit id"),
            ));
        }
        let key = key(owner, commit);
        let dir = self.root.join(&key);
        self.touch(&key);
        // A built template is settled before it is renamed into place (or after, once,
        // when an older provisioner built it): the marker alone says it is usable.
        if dir.join(SETTLED).is_file() {
            return Ok((dir, false));
        }
        let asked = Instant::now();
        let _held = self.building.lock(key.clone()).await;
        if dir.join(SETTLED).is_file() {
            // Not there when this call asked: built meanwhile.
            return Ok((dir, true));
        }
        if let Some(e) = self.failed_since(&key, asked) {
            return Err(e);
        }
        if dir.join(READY).is_file() {
            settle(&dir.join("workspace"), &[]).await?;
            std::fs::write(dir.join(SETTLED), "")
                .map_err(|e| ProvisionerError::internal("settle template", e))?;
            return Ok((dir, false));
        }
        if let Err(e) = self.build(&key, &dir, commit, build).await {
            self.failed(&key, &e);
            return Err(e);
        }
        self.drop_older(&key, spare);
        self.evict_in_the_background();
        Ok((dir, true))
    }

    /// Build into a `.tmp-` directory, then rename it to `dir`, marked ready.
    async fn build<F, Fut>(&self, key: &str, dir: &Path, commit: &str, build: F) -> Result<()>
    where
        F: FnOnce(PathBuf) -> Fut,
        Fut: Future<Output = Result<()>>,
    {
        let tmp = self
            .root
            .join(format!("{key}.tmp-{}", uuid::Uuid::new_v4().simple()));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&tmp)
            .map_err(|e| ProvisionerError::internal("create template", e))?;
        if let Err(e) = build(tmp.clone()).await {
            let _ = remove_all(&tmp);
            return Err(e);
        }
        let bytes = store::disk_usage(&tmp);
        let done = std::fs::write(tmp.join(BYTES), bytes.to_string())
            .and_then(|()| std::fs::write(tmp.join(SETTLED), ""))
            .and_then(|()| std::fs::write(tmp.join(READY), commit))
            .and_then(|()| std::fs::rename(&tmp, dir));
        if let Err(e) = done {
            let _ = remove_all(&tmp);
            return Err(ProvisionerError::internal("store template", e));
        }
        Ok(())
    }

    /// Older commits of the same owner are not needed any more, unless a live sandbox's
    /// overlay has one as its lower layer, or it was used in the last `spare` (eviction
    /// takes them later).
    fn drop_older(&self, key: &str, spare: Duration) {
        let prefix = owner_prefix(key);
        let now = std::time::SystemTime::now();
        let recent = |name: &str| {
            let used = self.used.lock().expect("templates lock").get(name).copied();
            used.is_some_and(|at| now.duration_since(at).unwrap_or_default() < spare)
        };
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
                && !recent(&name)
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
                    let _ = remove_all(&gone);
                }
            }
        }
    }

    /// The error of a build of `key` that failed after `since` (one this caller waited
    /// for).
    fn failed_since(&self, key: &str, since: Instant) -> Option<ProvisionerError> {
        let failures = self.failures.lock().expect("template failures");
        failures
            .get(key)
            .filter(|(at, _)| *at >= since)
            .map(|(_, e)| e.clone())
    }

    fn failed(&self, key: &str, e: &ProvisionerError) {
        let mut failures = self.failures.lock().expect("template failures");
        let now = Instant::now();
        failures.retain(|_, (at, _)| now.duration_since(*at) < FAILURE_KEPT);
        failures.insert(key.to_owned(), (now, e.clone()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_share_a_prefix_per_owner_only() {
        let c = "a".repeat(40);
        let (a, b) = (key("/r", &c), key("/r", &"b".repeat(40)));
        assert_eq!(owner_prefix(&a), owner_prefix(&b));
        assert!(owner_prefix(&a).ends_with('-'));
        assert_ne!(owner_prefix(&a), owner_prefix(&key("/s", &c)));
        assert!(a.ends_with(&c));
    }
}
