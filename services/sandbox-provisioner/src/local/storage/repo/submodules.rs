//! A remote repository's submodules, checked out host-side after its clone (a fork's
//! own, or its template's) with the tenant's credentials, as its own clone was: an
//! agent's sandbox never holds a credential, so it could not fetch a private
//! submodule itself.
//!
//! The repository's `.gitmodules` is hostile. Each submodule's URL is resolved (a
//! relative one against the URL of the repository that names it:
//! `crate::local::storage::repo::gitmodules`) and must be a remote one on a host
//! `FORKYARD_ALLOWED_GIT_HOSTS` admits, reached as the main repository is
//! (`crate::git::reach`: its addresses checked and pinned, the tenant's credential for
//! *that* host); `file://` URLs and local paths are refused. Each is an ordinary
//! `git clone` of its own, so one git process holds one host's credential only and
//! nothing has to merge several credentials' settings, with git's file transport off
//! (`GIT_ALLOW_PROTOCOL` without `file`, `protocol.file.allow=never`) and no hook.
//! Nested submodules are followed to [`MAX_DEPTH`] levels, [`MAX_COUNT`] in all.
//!
//! A submodule's repository is its worktree's own `.git` directory, not git's
//! `.git/modules/<name>` with a `gitdir:` file: that file and its `core.worktree` hold
//! paths, and a workspace is a copy of its template made elsewhere. Submodules of a
//! local repository are not checked out (as before): their URLs would name paths of
//! this host.

use crate::{
    error::{ProvisionerError, Result},
    git::{Reach, host_git},
    local::storage::repo::{
        git,
        git::run,
        gitmodules::{self, Entry, MAX_COUNT, refused},
    },
};
use forkyard_common::{
    allowed_hosts::AllowedHosts,
    git_credentials::GitCredentials,
    repo_location::{self, RepoLocation},
};
use std::{
    path::Path,
    time::{Duration, Instant},
};

/// How deeply submodules may nest (the repository's own are the first level).
pub(crate) const MAX_DEPTH: usize = 4;

/// Who reads remote repositories host-side: the tenant whose credentials are used,
/// from the hosts the operator allows.
#[derive(Clone, Copy)]
pub(crate) struct Reader<'a> {
    pub hosts: &'a AllowedHosts,
    pub credentials: &'a GitCredentials,
    pub tenant: &'a str,
}

impl Reader<'_> {
    /// How host git reaches `url` for this tenant (`crate::git::reach`).
    pub(crate) async fn reach(&self, url: &str) -> Result<Option<Reach>> {
        crate::git::reach(self.hosts, self.credentials, self.tenant, url).await
    }
}

/// A submodule checked out: its path in the workspace and the URL it was cloned from
/// (resolved, without credentials).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct Submodule {
    pub path: String,
    pub url: String,
}

/// Check out the submodules of the worktree `ws`, cloned from remote `url`, and theirs,
/// by `deadline`. `Err` names the submodule's path (never its URL's credentials).
pub(crate) async fn check_out(
    ws: &Path,
    url: &str,
    reader: Reader<'_>,
    deadline: Instant,
) -> Result<Vec<Submodule>> {
    let mut done: Vec<Submodule> = Vec::new();
    // (the repository's path in `ws`, its URL, its depth)
    let mut queue = vec![(String::new(), url.to_owned(), 0usize)];
    while let Some((at, base, depth)) = queue.pop() {
        let dir = if at.is_empty() {
            ws.to_path_buf()
        } else {
            ws.join(&at)
        };
        for entry in entries(&dir, &base, deadline).await? {
            let full = if at.is_empty() {
                entry.path.clone()
            } else {
                format!("{at}/{}", entry.path)
            };
            if depth + 1 > MAX_DEPTH {
                return Err(refused(
                    &full,
                    &format!("nested deeper than {MAX_DEPTH} levels"),
                ));
            }
            if done.len() >= MAX_COUNT {
                return Err(refused(&full, &format!("more than {MAX_COUNT} submodules")));
            }
            one(&dir, &full, &entry, reader, deadline).await?;
            done.push(Submodule {
                path: full.clone(),
                url: entry.url.clone(),
            });
            queue.push((full, entry.url, depth + 1));
        }
    }
    Ok(done)
}

/// Whether the tenant can read every submodule's repository now (a template's, made
/// earlier: `crate::local::storage::template::remote`).
pub(crate) async fn readable(
    subs: &[Submodule],
    reader: Reader<'_>,
    timeout: Duration,
) -> Result<()> {
    for sub in subs {
        let reach = reach(&sub.path, &sub.url, reader).await?;
        git::ls_remote(&sub.url, &["HEAD"], &reach, timeout)
            .await
            .map_err(|e| as_submodule(&sub.path, e))?;
    }
    Ok(())
}

/// An error about a submodule's repository said as one about the submodule.
fn as_submodule(path: &str, e: ProvisionerError) -> ProvisionerError {
    match e {
        ProvisionerError::RepoUnavailable(_) => {
            ProvisionerError::RepoUnavailable(format!("submodule {path} cannot be read"))
        }
        ProvisionerError::Internal(why) => {
            tracing::warn!(submodule = path, reason = %why, "submodule not read");
            ProvisionerError::Internal(format!("submodule {path} cannot be read now"))
        }
        other => other,
    }
}

/// How `url` (a submodule's, resolved) is reached: a remote URL without credentials
/// on an allowed host, else refused.
async fn reach(path: &str, url: &str, reader: Reader<'_>) -> Result<Reach> {
    let remote = match repo_location::locate(url) {
        Ok(RepoLocation::Remote(remote)) => remote,
        Ok(RepoLocation::Local(_)) => {
            return Err(refused(path, "a local path or file:// URL is not allowed"));
        }
        Err(why) => return Err(refused(path, &format!("its URL {why}"))),
    };
    if repo_location::carries_credentials(url) {
        return Err(refused(path, "its URL carries credentials"));
    }
    if !reader.hosts.admits(&remote.host, remote.port) {
        return Err(refused(
            path,
            &format!(
                "{} is not a git host sandboxes may clone from here (the operator lists them in {})",
                remote.host,
                reader.hosts.setting()
            ),
        ));
    }
    match reader.reach(url).await {
        Ok(Some(reach)) => Ok(reach),
        Ok(None) => Err(refused(path, "its URL is not a remote repository")),
        Err(e) => Err(as_submodule(path, e)),
    }
}

/// What is left of `deadline`, or the error of a checkout that ran out of time.
fn left(deadline: Instant) -> Result<Duration> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(ProvisionerError::Internal(
            "checking out submodules took too long".into(),
        ));
    }
    Ok(left)
}

/// The submodules `.gitmodules` of the worktree `dir` names that have a gitlink at
/// HEAD (git checks out no other), their URLs resolved against `base`.
async fn entries(dir: &Path, base: &str, deadline: Instant) -> Result<Vec<Entry>> {
    // Read from the commit, not the worktree: nothing of the worktree is followed. A
    // `.gitmodules` that is not a plain file (git checks out no link there) names none.
    match std::fs::symlink_metadata(dir.join(".gitmodules")) {
        Ok(m) if m.is_file() => {}
        _ => return Ok(Vec::new()),
    }
    let mut cmd = host_git();
    cmd.arg("-C").arg(dir).args([
        "config",
        "--blob",
        "HEAD:.gitmodules",
        "-z",
        "--get-regexp",
        r"^submodule\..*\.(path|url|update)$",
    ]);
    let listed = match run(cmd, left(deadline)?).await? {
        Ok(out) => out,
        // Exit 1: no such settings.
        Err(e) if e.contains("exited with 1") => String::new(),
        Err(e) => {
            return Err(ProvisionerError::FailedPrecondition(format!(
                "the repository's .gitmodules cannot be read: {e}"
            )));
        }
    };
    let mut named = gitmodules::parse(&listed)?;
    if named.is_empty() {
        return Ok(Vec::new());
    }
    let links = gitlinks(dir, named.iter().map(|e| e.path.as_str()), deadline).await?;
    named.retain_mut(|e| match links.iter().find(|(p, _)| *p == e.path) {
        Some((_, commit)) => {
            e.commit.clone_from(commit);
            true
        }
        None => false,
    });
    for e in &mut named {
        e.url = gitmodules::resolve(base, &e.url).map_err(|why| refused(&e.path, &why))?;
    }
    Ok(named)
}

/// The gitlinks (mode 160000) at `paths` in HEAD of the worktree `dir`: (path, commit).
async fn gitlinks<'p>(
    dir: &Path,
    paths: impl Iterator<Item = &'p str>,
    deadline: Instant,
) -> Result<Vec<(String, String)>> {
    let mut cmd = host_git();
    cmd.arg("-C")
        .arg(dir)
        .args(["--literal-pathspecs", "ls-tree", "-z", "HEAD", "--"])
        .args(paths);
    let out = run(cmd, left(deadline)?)
        .await?
        .map_err(|e| ProvisionerError::internal("list the repository's submodules", e))?;
    Ok(out
        .split('\0')
        .filter_map(|line| {
            let (meta, path) = line.split_once('\t')?;
            let mut f = meta.split(' ');
            let (mode, kind, id) = (f.next()?, f.next()?, f.next()?);
            (mode == "160000" && kind == "commit" && git::is_commit_id(id))
                .then(|| (path.to_owned(), id.to_owned()))
        })
        .collect())
}

/// Clone submodule `e` of the worktree `dir` (its path in the workspace: `full`) into
/// its directory, at its commit, and record it in `dir`'s git configuration as git's
/// own `submodule update --init` would.
async fn one(
    dir: &Path,
    full: &str,
    e: &Entry,
    reader: Reader<'_>,
    deadline: Instant,
) -> Result<()> {
    let reach = reach(full, &e.url, reader).await?;
    let into = dir.join(&e.path);
    plain_empty_dir(dir, &e.path).map_err(|why| refused(full, &why))?;
    let mut cmd = remote_git(&reach);
    cmd.args(["clone", "--quiet", "--no-checkout", "--template=", "--"])
        .arg(&e.url)
        .arg(&into);
    let cloned = run(cmd, left(deadline)?).await?;
    cloned.map_err(|why| as_submodule(full, unreadable_or_slow(&e.url, why)))?;
    at_commit(&into, full, e, &reach, deadline).await?;
    for (key, value) in [("url", e.url.as_str()), ("active", "true")] {
        let mut cmd = host_git();
        cmd.arg("-C")
            .arg(dir)
            .args(["config", &format!("submodule.{}.{key}", e.name), value]);
        run(cmd, left(deadline)?)
            .await?
            .map_err(|why| ProvisionerError::internal("record a submodule", why))?;
    }
    Ok(())
}

/// Host git reaching a submodule's repository by `reach`, its file transport off.
fn remote_git(reach: &Reach) -> tokio::process::Command {
    let mut cmd = host_git();
    cmd.args(&reach.pin)
        .args(["-c", "protocol.file.allow=never"])
        .env("GIT_ALLOW_PROTOCOL", "git:http:https:ssh")
        .envs(reach.env.iter().map(|(k, v)| (k, v)));
    cmd
}

/// Check out `e`'s commit in its clone `into`; one on no branch or tag the clone
/// fetched is asked for by id.
async fn at_commit(
    into: &Path,
    full: &str,
    e: &Entry,
    reach: &Reach,
    deadline: Instant,
) -> Result<()> {
    if checkout(into, &e.commit, deadline).await?.is_ok() {
        return Ok(());
    }
    let missing = || refused(full, &format!("its repository has no commit {}", e.commit));
    let mut cmd = remote_git(reach);
    cmd.arg("-C")
        .arg(into)
        .args(["fetch", "--quiet", "origin", &e.commit]);
    // The clone read it with this credential: a refusal now is of the commit.
    match run(cmd, left(deadline)?).await? {
        Err(why) if why.starts_with("git timed out") => {
            return Err(as_submodule(full, unreadable_or_slow(&e.url, why)));
        }
        Err(why) => {
            tracing::warn!(submodule = full, commit = %e.commit, reason = %why, "submodule commit not fetched");
            return Err(missing());
        }
        Ok(_) => {}
    }
    checkout(into, &e.commit, deadline)
        .await?
        .map(drop)
        .map_err(|_| missing())
}

async fn checkout(repo: &Path, commit: &str, deadline: Instant) -> Result<Result<String, String>> {
    let mut cmd = host_git();
    cmd.arg("-C")
        .arg(repo)
        .args(["checkout", "-q", "--detach", commit, "--"]);
    run(cmd, left(deadline)?).await
}

/// A clone's failure as the main repository's would be (`crate::git::unreadable`): a
/// time-out is worth another attempt.
fn unreadable_or_slow(url: &str, why: String) -> ProvisionerError {
    if why.starts_with("git timed out") {
        return ProvisionerError::Internal(crate::git::unreadable(url, why).to_string());
    }
    crate::git::unreadable(url, why)
}

/// Make sure `path` under `dir` is a plain empty directory (git checked the gitlink out
/// as one) reached through plain directories only: a clone into it never writes
/// through a link out of the workspace.
fn plain_empty_dir(dir: &Path, path: &str) -> std::result::Result<(), String> {
    let mut at = dir.to_path_buf();
    let parts: Vec<&str> = path.split('/').collect();
    for (i, part) in parts.iter().enumerate() {
        at.push(part);
        match std::fs::symlink_metadata(&at) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => return Err("its path is not a directory of the worktree".into()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && i + 1 == parts.len() => {
                return std::fs::create_dir(&at)
                    .map_err(|e| format!("cannot make its directory: {e}"));
            }
            Err(e) => return Err(format!("its path cannot be read: {e}")),
        }
    }
    let empty = std::fs::read_dir(&at)
        .map_err(|e| format!("its directory cannot be read: {e}"))?
        .next()
        .is_none();
    if !empty {
        return Err("its directory is not empty".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_submodule_directory_is_plain_and_empty() {
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(t.path().join("a/b")).unwrap();
        assert!(plain_empty_dir(t.path(), "a/b").is_ok());
        assert!(plain_empty_dir(t.path(), "a/new").is_ok());
        assert!(t.path().join("a/new").is_dir());
        std::os::unix::fs::symlink("/tmp", t.path().join("link")).unwrap();
        assert!(plain_empty_dir(t.path(), "link/x").is_err());
        assert!(plain_empty_dir(t.path(), "link").is_err());
        assert!(plain_empty_dir(t.path(), "a").is_err(), "not empty");
        assert!(plain_empty_dir(t.path(), "missing/x").is_err());
    }
}
