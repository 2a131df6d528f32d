//! Git as both backends use it: a new branch's name, checked on the host, and the
//! environment and the diff output of git run inside a sandbox. (The local backend's
//! clones on the host are `local::storage::repo::git`.)

use crate::error::{ProvisionerError, Result};
use forkyard_common::{
    allowed_hosts::{AllowedHosts, Refusal},
    git_pin::GitPin,
    repo_location::{self, PROXY_VARS, Remote, RepoLocation},
};
use forkyard_proto::common::v1::DiffStat;
use std::{process::Stdio, time::Duration};
use tokio::process::Command;

/// How long git may take to judge a branch name.
const CHECK_TIMEOUT: Duration = Duration::from_secs(10);

/// A host git command with a predictable environment: no prompts, no user or system
/// configuration, only the transports a repository may name (no `ext::` or `fd::`), no
/// proxy (it would resolve a checked host's name again).
pub(crate) fn host_git() -> Command {
    let mut cmd = Command::new("git");
    cmd.env("GIT_TERMINAL_PROMPT", "0")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_ASKPASS", "/bin/false")
        .env("GIT_SSH_COMMAND", forkyard_common::git_pin::SSH_COMMAND)
        .env("GIT_ALLOW_PROTOCOL", "file:git:http:https:ssh")
        .env_remove("GIT_DIR")
        .env_remove("GIT_WORK_TREE")
        .args([
            "-c",
            "protocol.ext.allow=never",
            "-c",
            "core.hooksPath=/dev/null",
        ]);
    for var in PROXY_VARS {
        cmd.env_remove(var);
    }
    cmd
}

/// A remote repository's host by name: one the operator allows (`--allowed-git-hosts`).
pub(crate) fn check_repo_host(hosts: &AllowedHosts, remote: &Remote) -> Result<()> {
    if hosts.admits(&remote.host, remote.port) {
        return Ok(());
    }
    Err(ProvisionerError::invalid(
        "repo",
        format!(
            "{} is not a git host sandboxes may clone from here (the operator lists them in {})",
            remote.host,
            hosts.setting()
        ),
    ))
}

/// How host git reaches a remote repository: `-c` settings that hold it to the
/// host's checked addresses, and the environment of the tenant's credential.
#[derive(Default)]
pub(crate) struct Reach {
    pub pin: Vec<String>,
    pub env: Vec<(String, String)>,
}

/// How a clone of `repo` for `tenant` reaches it: its host's addresses checked (public,
/// or the host listed) and the clone held to them, with the git credential the mesh
/// holds for the tenant and that host, if any; `None` for a local path.
pub(crate) async fn reach(
    hosts: &AllowedHosts,
    credentials: &forkyard_common::git_credentials::GitCredentials,
    tenant: &str,
    repo: &str,
) -> Result<Option<Reach>> {
    let Ok(RepoLocation::Remote(remote)) = repo_location::locate(repo) else {
        return Ok(None);
    };
    // The host first: a GitHub App's token is minted over the network, never for a
    // repository that is refused anyway.
    let pin = pin(hosts, repo, &remote).await?;
    let credential = credentials
        .resolve(tenant, &remote)
        .await
        .map_err(|why| unreadable(repo, why))?;
    let env = pin.env(credential.map(|c| c.git_env(&remote)).unwrap_or_default());
    Ok(Some(Reach { pin: pin.args, env }))
}

/// What holds a clone of `remote` to its checked addresses (`forkyard_common::git_pin`).
async fn pin(hosts: &AllowedHosts, repo: &str, remote: &Remote) -> Result<GitPin> {
    let addrs = match hosts.resolve(&remote.host, remote.port).await {
        Ok(addrs) => addrs,
        Err(Refusal::NotListed { .. }) => return Err(check_repo_host(hosts, remote).unwrap_err()),
        Err(other) => return Err(unreadable(repo, other)),
    };
    Ok(GitPin::new(repo, remote, &addrs).await)
}

/// The one answer for a remote repository that cannot be read, whatever the reason
/// (logged): git's own errors would tell a caller which ports of which hosts answer.
pub(crate) fn unreadable(repo: &str, why: impl std::fmt::Display) -> ProvisionerError {
    let shown = repo_location::shown(repo);
    tracing::warn!(repo = %shown, reason = %why, "repository cannot be read");
    ProvisionerError::RepoUnavailable(format!("{shown} cannot be read"))
}

/// Names git's ref rules surely accept, checked without starting git: letters, digits
/// and `_ - . /`, no empty or dot-led component, no `..`, no `.lock` component end.
fn plainly_valid_branch(b: &str) -> bool {
    b != "HEAD"
        && b.bytes()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'-' | b'.' | b'/'))
        && !b.starts_with('-')
        && !b.contains("..")
        && !b.ends_with('.')
        && b.split('/')
            .all(|c| !c.is_empty() && !c.starts_with('.') && !c.ends_with(".lock"))
}

/// `Ok(())` when `branch` is a valid name for a new branch.
pub async fn check_branch(branch: &str) -> Result<()> {
    if plainly_valid_branch(branch) {
        return Ok(());
    }
    if branch.is_empty() {
        return Err(ProvisionerError::invalid("branch", "must not be empty"));
    }
    if branch.starts_with('-') {
        return Err(ProvisionerError::invalid(
            "branch",
            format!("{branch:?} is not a valid branch name"),
        ));
    }
    if git_accepts(branch).await? {
        Ok(())
    } else {
        Err(ProvisionerError::invalid(
            "branch",
            format!("{branch:?} is not a valid branch name"),
        ))
    }
}

/// `git check-ref-format --branch`: whether git takes `branch` for a new branch's name
/// (a git that fails, or does not answer in time, does not). Its output is not read, so
/// it is run bare rather than through the local backend's capped process runner, which
/// the e2b backend cannot reach.
#[tracing::instrument(name = "git", skip_all, fields(step = "check-ref-format", exit_code = tracing::field::Empty))]
async fn git_accepts(branch: &str) -> Result<bool> {
    let mut cmd = host_git();
    cmd.args(["check-ref-format", "--branch", branch])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true);
    let mut child = cmd
        .spawn()
        .map_err(|e| ProvisionerError::internal("cannot run git", e))?;
    // On a timeout the child is dropped, which kills it.
    match tokio::time::timeout(CHECK_TIMEOUT, child.wait()).await {
        Ok(Ok(status)) => {
            if let Some(code) = status.code() {
                tracing::Span::current().record("exit_code", code);
            }
            Ok(status.success())
        }
        Ok(Err(_)) | Err(_) => Ok(false),
    }
}

/// Environment for git inside the sandbox: the agent controls the repository's config
/// and hooks, so pin what changes the patch's shape and never run hooks.
pub fn sandbox_env() -> Vec<(String, String)> {
    let config = [
        ("safe.directory", "*"),
        ("core.hooksPath", "/dev/null"),
        ("core.fsmonitor", "false"),
        // A workspace is a copy of its template: only what a copy keeps (whole-second
        // mtime, size, mode) tells git a file is unchanged (local/template/settle.rs).
        ("core.checkStat", "minimal"),
        ("core.trustctime", "false"),
        ("diff.noprefix", "false"),
        ("diff.mnemonicPrefix", "false"),
        ("diff.relative", "false"),
        ("color.ui", "false"),
    ];
    let mut env = vec![("GIT_CONFIG_COUNT".to_owned(), config.len().to_string())];
    for (i, (k, v)) in config.iter().enumerate() {
        env.push((format!("GIT_CONFIG_KEY_{i}"), (*k).to_owned()));
        env.push((format!("GIT_CONFIG_VALUE_{i}"), (*v).to_owned()));
    }
    for (k, v) in [
        ("GIT_CONFIG_NOSYSTEM", "1"),
        ("GIT_TERMINAL_PROMPT", "0"),
        // The base is the commit itself: a `git replace` of the agent's cannot stand in
        // for it (or make an untouched worktree differ from it).
        ("GIT_NO_REPLACE_OBJECTS", "1"),
        ("GIT_AUTHOR_NAME", "forkyard"),
        ("GIT_AUTHOR_EMAIL", "forkyard@localhost"),
        ("GIT_COMMITTER_NAME", "forkyard"),
        ("GIT_COMMITTER_EMAIL", "forkyard@localhost"),
    ] {
        env.push((k.to_owned(), v.to_owned()));
    }
    env
}

/// Diffstat from `git diff --numstat`: one line per file, `-\t-` for binary files
/// (changed, 0 lines).
pub fn parse_numstat(out: &str) -> DiffStat {
    let mut stat = DiffStat::default();
    for line in out.lines().filter(|l| !l.trim().is_empty()) {
        let mut cols = line.splitn(3, '\t');
        let ins = cols.next().and_then(|c| c.parse::<u32>().ok()).unwrap_or(0);
        let del = cols.next().and_then(|c| c.parse::<u32>().ok()).unwrap_or(0);
        stat.files_changed += 1;
        stat.insertions = stat.insertions.saturating_add(ins);
        stat.deletions = stat.deletions.saturating_add(del);
    }
    stat
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numstat_counts_text_and_binary_files() {
        let s = parse_numstat("3\t1\tsrc/a.rs\n-\t-\timg.png\n0\t2\told => new\n");
        assert_eq!((s.files_changed, s.insertions, s.deletions), (3, 3, 3));
        assert_eq!(parse_numstat(""), DiffStat::default());
    }

    #[tokio::test]
    async fn branch_names_are_checked_by_git() {
        assert!(check_branch("forkyard-fork-2").await.is_ok());
        for bad in [
            "",
            "a..b",
            "-x",
            "a b",
            "x.lock",
            "HEAD",
            "a/.b",
            "a//b",
            "a/",
            "x.",
            "a@{1",
            "a/b.lock/c",
        ] {
            assert!(check_branch(bad).await.is_err(), "{bad:?} accepted");
        }
        // The fast path agrees with git on names it accepts.
        for good in ["forkyard-fork-2", "feature/x.y", "a_b/c-d", "v1.2"] {
            assert!(plainly_valid_branch(good), "{good:?}");
            assert!(git_accepts(good).await.unwrap(), "{good:?}");
        }
    }
}
