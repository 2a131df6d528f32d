//! The local backend's git on the host: a sandbox's clone (made before any agent touched
//! the workspace) and the templates' clones it is copied from.

use crate::{
    error::{ProvisionerError, Result},
    git::{Reach, host_git},
    local::{
        base::fs::remove_all,
        isolation::command::{
            launch,
            process::{self, Caps, Outcome},
        },
    },
};
use std::{io::ErrorKind, path::Path, time::Duration};
use tokio::process::Command;
use tokio_util::sync::CancellationToken;

const HOST_GIT_CAPS: Caps = Caps {
    stdout: 64 * 1024,
    stderr: 64 * 1024,
    tail: false,
};
/// How much of git's stderr goes into an error message.
const STDERR_SUMMARY: usize = 600;

/// Run host git; `Ok(stdout)` on success, `Err(summary of stderr)` on a git failure.
/// Traced as a `git` span naming the step (`clone`, `rev-parse`, ...) and its exit.
#[tracing::instrument(name = "git", skip_all, fields(step = step(&cmd), exit_code = tracing::field::Empty))]
pub(crate) async fn run(cmd: Command, timeout: Duration) -> Result<Result<String, String>> {
    let f = process::run(
        launch::Launch::Process(cmd),
        None,
        timeout,
        HOST_GIT_CAPS,
        &CancellationToken::new(),
    )
    .await
    .map_err(|e| ProvisionerError::internal("cannot run git", e))?;
    if let Outcome::Exited { code } = f.outcome {
        tracing::Span::current().record("exit_code", code);
    }
    Ok(match f.outcome {
        Outcome::Exited { code: 0 } => Ok(f.stdout.lossy()),
        Outcome::Exited { code } => Err(summarise(&f.stderr.lossy(), code)),
        Outcome::TimedOut => Err(format!("git timed out after {}s", timeout.as_secs())),
        Outcome::Cancelled => Err("git was cancelled".into()),
    })
}

/// The git subcommand of `cmd`: its first argument that is neither an option nor the
/// value of `-c` or `-C`. Never a URL or a path (those may hold credentials).
fn step(cmd: &Command) -> String {
    let mut args = cmd.as_std().get_args().map(|a| a.to_string_lossy());
    while let Some(a) = args.next() {
        match a.as_ref() {
            "-c" | "-C" => {
                args.next();
            }
            a if a.starts_with('-') => {}
            a => return a.to_owned(),
        }
    }
    String::new()
}

fn summarise(stderr: &str, code: i32) -> String {
    let text = stderr.split_whitespace().collect::<Vec<_>>().join(" ");
    let mut text = if text.is_empty() {
        format!("git exited with {code}")
    } else {
        text
    };
    if text.len() > STDERR_SUMMARY {
        let cut = (0..=STDERR_SUMMARY)
            .rev()
            .find(|i| text.is_char_boundary(*i))
            .unwrap_or(0);
        text.truncate(cut);
        text.push_str("...");
    }
    text
}

/// A clone of `repo` that failed with git's `e`; `remote`: reached by
/// [`crate::git::reach`], so the caller learns only that it cannot be read.
pub(crate) fn clone_failed(repo: &str, e: String, remote: bool) -> ProvisionerError {
    let timed_out = e.starts_with("git timed out");
    match (timed_out, remote) {
        // Slow network or a big repo: worth another attempt.
        (true, true) => ProvisionerError::Internal(crate::git::unreadable(repo, e).to_string()),
        (true, false) => ProvisionerError::internal(&format!("cloning {repo}"), e),
        (false, true) => crate::git::unreadable(repo, e),
        (false, false) => ProvisionerError::RepoUnavailable(format!("cannot clone {repo}: {e}")),
    }
}

/// A full commit id (SHA-1 or SHA-256, lower case): safe in a path, and what git
/// prints.
pub(crate) fn is_commit_id(s: &str) -> bool {
    matches!(s.len(), 40 | 64) && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// Clone `repo` into `ws`, start `branch` at `base_ref` (or HEAD) and return the base
/// commit. `reach`: how a remote repository is reached (`crate::git::reach`: its checked
/// addresses, the tenant's credential); its errors then say only that it cannot be read.
/// A credential is in the clone's environment only: the workspace's `.git/config`
/// names the repository's URL, which never carries one.
pub async fn clone(
    repo: &str,
    base_ref: &str,
    branch: &str,
    ws: &Path,
    timeout: Duration,
    reach: Option<&crate::git::Reach>,
) -> Result<String> {
    let pin = reach.map(|r| r.pin.as_slice());
    let mut cmd = host_git();
    cmd.args(pin.unwrap_or_default());
    if let Some(r) = reach {
        cmd.envs(r.env.iter().map(|(k, v)| (k, v)));
    }
    // --no-local: a local path goes through git's transport, not a file copy that would
    // follow symlinks planted in the source's .git.
    cmd.args(["clone", "--quiet", "--no-local", "--", repo])
        .arg(ws);
    run(cmd, timeout)
        .await?
        .map_err(|e| clone_failed(repo, e, pin.is_some()))?;

    let start = if base_ref.is_empty() {
        "HEAD".to_owned()
    } else {
        resolve(ws, base_ref).await?
    };
    let mut cmd = host_git();
    cmd.arg("-C")
        .arg(ws)
        .args(["checkout", "-q", "-b", branch, &start, "--"]);
    run(cmd, Duration::from_secs(60)).await?.map_err(|e| {
        ProvisionerError::FailedPrecondition(format!("cannot create branch {branch}: {e}"))
    })?;

    let mut cmd = host_git();
    cmd.arg("-C")
        .arg(ws)
        .args(["rev-parse", "--verify", "HEAD^{commit}"]);
    let sha = run(cmd, Duration::from_secs(30)).await?.map_err(|e| {
        ProvisionerError::RepoUnavailable(format!("repository has no commit at HEAD: {e}"))
    })?;
    Ok(sha.trim().to_owned())
}

/// Clone `repo` into `ws` with HEAD detached at `commit`, without git's template files
/// (hook samples, description): the source of [`crate::local::storage::template`] copies.
/// `reach`: as for [`clone`].
pub async fn clone_detached(
    repo: &str,
    commit: &str,
    ws: &Path,
    timeout: Duration,
    reach: Option<&crate::git::Reach>,
) -> Result<()> {
    let mut cmd = host_git();
    if let Some(r) = reach {
        cmd.args(&r.pin).envs(r.env.iter().map(|(k, v)| (k, v)));
    }
    cmd.args(["clone", "--quiet", "--no-local", "--template=", "--", repo])
        .arg(ws);
    run(cmd, timeout)
        .await?
        .map_err(|e| clone_failed(repo, e, reach.is_some()))?;
    let mut cmd = host_git();
    cmd.arg("-C")
        .arg(ws)
        .args(["checkout", "-q", "--detach", commit, "--"]);
    run(cmd, Duration::from_secs(60)).await?.map_err(|e| {
        tracing::warn!(repo = %forkyard_common::repo_location::shown(repo), commit, reason = %e, "template checkout failed");
        ProvisionerError::invalid("base_ref", format!("{commit:?} is not a commit in the repository"))
    })?;
    // The default branch's loose ref into `packed-refs`: one file fewer in every copy.
    let mut cmd = host_git();
    cmd.arg("-C")
        .arg(ws)
        .args(["pack-refs", "--all", "--prune"]);
    run(cmd, Duration::from_secs(60))
        .await?
        .map_err(|e| ProvisionerError::Internal(format!("pack the template's refs: {e}")))?;
    trim_template(&ws.join(".git")).map_err(|e| ProvisionerError::internal("prepare template", e))
}

/// Record the worktree's stat data in the index (after [`crate::local::storage::template`] set
/// its files' mtimes), so no copy's git has to hash a file to know it is unchanged.
pub async fn refresh_index(ws: &Path) -> Result<()> {
    let mut cmd = host_git();
    cmd.arg("-C")
        .arg(ws)
        .args(["update-index", "-q", "--refresh"]);
    run(cmd, Duration::from_secs(600))
        .await?
        .map(drop)
        .map_err(|e| ProvisionerError::Internal(format!("refresh the template's index: {e}")))
}

/// Every sandbox's workspace is a copy of the template, so each file and directory in
/// it is made (and later removed) once per fork: the clone's reflogs (its "clone: from
/// <host path>" entries) and its empty `refs/tags` and `objects/info` go; git makes them
/// again when it needs them. On a filesystem without a journal, ext4 makes each new
/// file step over the files removed in the last minute, so a wave's creates right after
/// a run's destroys cost in proportion to both. The directories a clone has and agents
/// may write into (`hooks`, `info`, without the samples) stay.
fn trim_template(git_dir: &Path) -> std::io::Result<()> {
    remove_all(&git_dir.join("logs"))?;
    for empty in ["refs/tags", "objects/info"] {
        if let Err(e) = std::fs::remove_dir(git_dir.join(empty))
            && !matches!(e.kind(), ErrorKind::NotFound | ErrorKind::DirectoryNotEmpty)
        {
            return Err(e);
        }
    }
    for d in ["hooks", "info"] {
        std::fs::create_dir_all(git_dir.join(d))?;
    }
    Ok(())
}

/// The commit `base_ref` names in the clone: as given, else as a remote branch.
async fn resolve(ws: &Path, base_ref: &str) -> Result<String> {
    if base_ref.starts_with('-') {
        return Err(ProvisionerError::invalid(
            "base_ref",
            format!("{base_ref:?} is not a commit-ish"),
        ));
    }
    for candidate in [base_ref.to_owned(), format!("origin/{base_ref}")] {
        let mut cmd = host_git();
        cmd.arg("-C")
            .arg(ws)
            .args(["rev-parse", "--verify", "--quiet", "--end-of-options"]);
        cmd.arg(format!("{candidate}^{{commit}}"));
        if let Ok(sha) = run(cmd, Duration::from_secs(30)).await? {
            return Ok(sha.trim().to_owned());
        }
    }
    Err(ProvisionerError::invalid(
        "base_ref",
        format!("{base_ref:?} is not a commit in the repository"),
    ))
}

/// `git ls-remote` of `repo` for `patterns`, reached by `reach`: its output, or the
/// error a clone of `repo` would give ([`clone_failed`]).
pub(crate) async fn ls_remote(
    repo: &str,
    patterns: &[&str],
    reach: &Reach,
    timeout: Duration,
) -> Result<String> {
    let mut cmd = host_git();
    cmd.args(&reach.pin)
        .envs(reach.env.iter().map(|(k, v)| (k, v)))
        .args(["ls-remote", "--quiet", "--", repo])
        .args(patterns);
    run(cmd, timeout)
        .await?
        .map_err(|e| clone_failed(repo, e, true))
}
