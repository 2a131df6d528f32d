//! `LaunchRun`'s repository check: the repository answers, and its base ref names a
//! commit (asked of git only where its ref files cannot tell).
//!
//! A remote repository is read only from a host `FORKYARD_ALLOWED_GIT_HOSTS` admits, at
//! addresses checked to be public (unless the operator listed the host), and whatever
//! keeps it from being read gives the caller one message: git's own errors (connection
//! refused, not a git server, a timeout) would tell a caller which ports of which hosts
//! answer. The detail goes to the log.

use crate::error::GatewayError;
use forkyard_common::{
    allowed_hosts::{AllowedHosts, Refusal},
    git_credentials::GitCredentials,
    git_pin::GitPin,
    host_git,
    repo_location::{self, Remote, RepoLocation},
};
use std::time::Duration;

/// How long git may take to answer.
const GIT_TIMEOUT: Duration = Duration::from_secs(30);

/// Who reads a remote repository: the run's tenant, with the credentials the mesh holds
/// for it (`forkyard_common::git_credentials`).
#[derive(Clone, Copy)]
pub struct Reader<'a> {
    pub tenant: &'a str,
    pub credentials: &'a GitCredentials,
}

/// The repository must exist and answer `git ls-remote`; a local path that does not
/// exist is bad input, a repository that cannot be read is a failed precondition.
pub async fn check_repo(
    repo: &str,
    base_ref: &str,
    hosts: &AllowedHosts,
    reader: Reader<'_>,
) -> Result<(), GatewayError> {
    match repo_location::locate(repo) {
        Err(why) => Err(GatewayError::field("repo", why)),
        Ok(RepoLocation::Remote(remote)) => {
            check_remote(repo, &remote, base_ref, hosts, reader).await
        }
        Ok(RepoLocation::Local(path)) => {
            let path = path
                .to_str()
                .ok_or_else(|| GatewayError::field("repo", "is not a UTF-8 path"))?;
            check_local(path, base_ref).await
        }
    }
}

async fn check_local(repo: &str, base_ref: &str) -> Result<(), GatewayError> {
    check_local_head(repo).await?;
    if base_ref.is_empty() || base_ref == "HEAD" {
        return Ok(());
    }
    if forkyard_common::git_refs::local_commit(repo, base_ref).is_some() {
        return Ok(());
    }
    // A tag, an abbreviated id or an expression (HEAD~2): only git can tell.
    let spec = format!("{base_ref}^{{commit}}");
    let out = git(
        &[],
        &[
            "-C",
            repo,
            "-c",
            "core.fsmonitor=false",
            "rev-parse",
            "--verify",
            "--quiet",
            "--end-of-options",
            &spec,
        ],
    )
    .await
    .map_err(|why| GatewayError::FailedPrecondition(format!("repo: {why}")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(GatewayError::field(
            "base_ref",
            format!("{base_ref:?} names no commit in {repo}"),
        ))
    }
}

async fn check_local_head(repo: &str) -> Result<(), GatewayError> {
    if !std::path::Path::new(repo).exists() {
        return Err(GatewayError::field(
            "repo",
            format!("{repo:?} does not exist (not a URL and no such path)"),
        ));
    }
    // A local repository whose HEAD resolves from its ref files answers as `git
    // ls-remote` would, without two git processes (about 6 ms on every LaunchRun's
    // way); anything else (a repository only git can read) asks git.
    if forkyard_common::git_refs::local_commit(repo, "HEAD").is_some() {
        return Ok(());
    }
    let out = git(
        &[],
        &["ls-remote", "--quiet", "--exit-code", "--", repo, "HEAD"],
    )
    .await
    .map_err(|why| GatewayError::FailedPrecondition(format!("repo: {why}")))?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let reason = stderr
            .lines()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("no HEAD (empty repository?)");
        return Err(GatewayError::FailedPrecondition(format!(
            "repo: {repo:?} cannot be cloned: {}",
            reason.trim()
        )));
    }
    Ok(())
}

/// What holds a remote's reads to the addresses of its host, once the host is admitted
/// and its addresses checked (`forkyard_common::git_pin`).
async fn admitted(
    repo: &str,
    shown: &str,
    remote: &Remote,
    hosts: &AllowedHosts,
) -> Result<GitPin, GatewayError> {
    let addrs = hosts.resolve(&remote.host, remote.port).await.map_err(
        |refusal| match refusal {
            Refusal::NotListed { .. } => GatewayError::field(
                "repo",
                format!(
                    "{} is not a git host runs may read from here (the operator lists them in {})",
                    remote.host,
                    hosts.setting()
                ),
            ),
            other => unreadable(shown, other),
        },
    )?;
    Ok(GitPin::new(repo, remote, &addrs).await)
}

/// A remote repository: its host admitted and its addresses checked, then `git
/// ls-remote` held to those addresses.
async fn check_remote(
    repo: &str,
    remote: &Remote,
    base_ref: &str,
    hosts: &AllowedHosts,
    reader: Reader<'_>,
) -> Result<(), GatewayError> {
    let shown = repo_location::shown(repo);
    let pin = admitted(repo, &shown, remote, hosts).await?;
    let credential = reader
        .credentials
        .resolve(reader.tenant, remote)
        .await
        .map_err(|why| unreadable(&shown, why))?;
    let env = pin.env(
        credential
            .as_ref()
            .map(|c| c.git_env(remote))
            .unwrap_or_default(),
    );
    let out = ls_remote(&pin.args, &env, repo, "HEAD")
        .await
        .map_err(|why| unreadable(&shown, why))?;
    if !out.status.success() {
        let line = stderr_line(&out);
        let stderr = String::from_utf8_lossy(&out.stderr);
        // Without a credential, no known_hosts file is the tenant's: it has none.
        if credential.is_some() && stderr.contains(HOST_KEY_REFUSED) {
            return Err(host_key_unknown(remote, reader.tenant, &line));
        }
        if forkyard_common::git_credentials::asks_for_credentials(&stderr) {
            return Err(refused(
                &remote.host,
                reader.tenant,
                credential.is_some(),
                &line,
            ));
        }
        return Err(unreadable(&shown, line));
    }
    // A remote is asked for branches and tags of that name; a commit id cannot be
    // checked short of cloning, and is taken as given.
    if base_ref.is_empty()
        || base_ref == "HEAD"
        || (base_ref.len() >= 7 && base_ref.bytes().all(|b| b.is_ascii_hexdigit()))
    {
        return Ok(());
    }
    let out = ls_remote(&pin.args, &env, repo, base_ref)
        .await
        .map_err(|why| unreadable(&shown, why))?;
    match out.status.code() {
        Some(0) => Ok(()),
        // `--exit-code`: the repository answered, and has no such ref.
        Some(2) => Err(GatewayError::field(
            "base_ref",
            format!("{base_ref:?} is no branch or tag of {shown}"),
        )),
        _ => Err(unreadable(&shown, stderr_line(&out))),
    }
}

async fn ls_remote(
    pin: &[String],
    env: &[(String, String)],
    repo: &str,
    r: &str,
) -> Result<std::process::Output, String> {
    git_with(
        pin,
        env,
        &["ls-remote", "--quiet", "--exit-code", "--", repo, r],
    )
    .await
}

/// What ssh says when the host's key is not among those its known_hosts file holds.
const HOST_KEY_REFUSED: &str = "Host key verification failed";

/// An SSH host whose key the tenant's credential does not know (another key, or none
/// for it): the mesh refused the host, not the host the credential, and says so, so the
/// operator fixes the known_hosts file rather than the deploy key.
fn host_key_unknown(remote: &Remote, tenant: &str, why: &str) -> GatewayError {
    tracing::warn!(host = %remote.host, port = remote.port, tenant, reason = %why, "SSH host key not known; refused");
    GatewayError::FailedPrecondition(format!(
        "repo: the SSH host key of {}:{} is not one tenant {tenant}'s git credential knows (its known_hosts_file in FORKYARD_GIT_CREDENTIALS); a host key is never trusted on first use",
        remote.host, remote.port
    ))
}

/// A host that wants credentials the tenant has not, or refused the tenant's: the
/// caller learns which, and what to ask the operator for (git's answer is logged).
fn refused(host: &str, tenant: &str, had: bool, why: &str) -> GatewayError {
    tracing::warn!(host, tenant, reason = %why, had_credentials = had, "repository refused the tenant's access");
    GatewayError::FailedPrecondition(if had {
        format!(
            "repo: {host} refused tenant {tenant}'s git credentials (the operator's FORKYARD_GIT_CREDENTIALS)"
        )
    } else {
        format!(
            "repo: {host} wants git credentials and tenant {tenant} has none for it (the operator gives them in FORKYARD_GIT_CREDENTIALS)"
        )
    })
}

/// The one answer for a remote repository that cannot be read, whatever the reason
/// (logged).
fn unreadable(shown: &str, why: impl std::fmt::Display) -> GatewayError {
    tracing::warn!(repo = %shown, reason = %why, "repository cannot be read");
    GatewayError::FailedPrecondition(format!("repo: repository {shown} cannot be read"))
}

/// The line of git's stderr that says why (`host_git::reason`); nothing said, for
/// `ls-remote --exit-code`, means no HEAD.
fn stderr_line(out: &std::process::Output) -> String {
    if out.stderr.iter().all(u8::is_ascii_whitespace) {
        return "no HEAD (empty repository?)".to_owned();
    }
    host_git::reason(out)
}

/// Host git with the caller-chosen repository (`host_git`: no prompts, no user or
/// system config, no proxy), `config` (`-c` pairs) first.
async fn git(
    config: &[String],
    args: &[impl AsRef<std::ffi::OsStr>],
) -> Result<std::process::Output, String> {
    git_with(config, &[], args).await
}

/// [`git`] with `env` (a credential's) over the defaults.
async fn git_with(
    config: &[String],
    env: &[(String, String)],
    args: &[impl AsRef<std::ffi::OsStr>],
) -> Result<std::process::Output, String> {
    let mut cmd = host_git::command(config, env);
    cmd.args(args);
    host_git::output(cmd, None, GIT_TIMEOUT).await
}

#[cfg(test)]
#[path = "repo_check_tests.rs"]
mod tests;
