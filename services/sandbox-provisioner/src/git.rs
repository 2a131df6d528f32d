//! Git on the host (only for the initial clone, before any agent touched the workspace)
//! and the pieces of in-sandbox git the patch collection needs.

use crate::{
    error::{ProvisionerError, Result},
    local::process::{self, Caps, Outcome},
};
use forkyard_proto::common::v1::DiffStat;
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

/// A host git command with a predictable environment: no prompts, no user or system
/// configuration, no `ext::` transport.
fn host_git() -> Command {
    let mut cmd = Command::new("git");
    cmd.env("GIT_TERMINAL_PROMPT", "0")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_ASKPASS", "/bin/false")
        .env("GIT_SSH_COMMAND", "ssh -oBatchMode=yes")
        .env_remove("GIT_DIR")
        .env_remove("GIT_WORK_TREE")
        .args([
            "-c",
            "protocol.ext.allow=never",
            "-c",
            "core.hooksPath=/dev/null",
        ]);
    cmd
}

/// Run host git; `Ok(stdout)` on success, `Err(summary of stderr)` on a git failure.
/// Traced as a `git` span naming the step (`clone`, `rev-parse`, ...) and its exit.
#[tracing::instrument(name = "git", skip_all, fields(step = step(&cmd), exit_code = tracing::field::Empty))]
async fn run(cmd: Command, timeout: Duration) -> Result<Result<String, String>> {
    let f = process::run(
        crate::local::launch::Launch::Process(cmd),
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
    let mut cmd = host_git();
    cmd.args(["check-ref-format", "--branch", branch]);
    match run(cmd, Duration::from_secs(10)).await? {
        Ok(_) => Ok(()),
        Err(_) => Err(ProvisionerError::invalid(
            "branch",
            format!("{branch:?} is not a valid branch name"),
        )),
    }
}

/// Clone `repo` into `ws`, start `branch` at `base_ref` (or HEAD) and return the base
/// commit.
pub async fn clone(
    repo: &str,
    base_ref: &str,
    branch: &str,
    ws: &Path,
    timeout: Duration,
) -> Result<String> {
    let mut cmd = host_git();
    // --no-local: a local path goes through git's transport, not a file copy that would
    // follow symlinks planted in the source's .git.
    cmd.args(["clone", "--quiet", "--no-local", "--", repo])
        .arg(ws);
    run(cmd, timeout).await?.map_err(|e| {
        if e.starts_with("git timed out") {
            // Slow network or a big repo: worth another attempt.
            ProvisionerError::internal(&format!("cloning {repo}"), e)
        } else {
            ProvisionerError::RepoUnavailable(format!("cannot clone {repo}: {e}"))
        }
    })?;

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
/// (hook samples, description): the source of [`crate::local::template`] copies.
pub async fn clone_detached(repo: &str, commit: &str, ws: &Path, timeout: Duration) -> Result<()> {
    let mut cmd = host_git();
    cmd.args(["clone", "--quiet", "--no-local", "--template=", "--", repo])
        .arg(ws);
    run(cmd, timeout)
        .await?
        .map_err(|e| ProvisionerError::RepoUnavailable(format!("cannot clone {repo}: {e}")))?;
    let mut cmd = host_git();
    cmd.arg("-C")
        .arg(ws)
        .args(["checkout", "-q", "--detach", commit, "--"]);
    run(cmd, Duration::from_secs(60)).await?.map_err(|e| {
        ProvisionerError::RepoUnavailable(format!("{repo} has no commit {commit}: {e}"))
    })?;
    trim_template(&ws.join(".git")).map_err(|e| ProvisionerError::internal("prepare template", e))
}

/// Every sandbox's workspace is a copy of the template, so each file and directory in
/// it is made (and later removed) once per fork: the clone's reflogs (its "clone: from
/// <host path>" entries) and its empty `refs/tags` and `objects/info` go; git makes them
/// again when it needs them. On a filesystem without a journal, ext4 makes each new
/// file step over the files removed in the last minute, so a wave's creates right after
/// a run's destroys cost in proportion to both. The directories a clone has and agents
/// may write into (`hooks`, `info`, without the samples) stay.
fn trim_template(git_dir: &Path) -> std::io::Result<()> {
    crate::local::store::remove_all(&git_dir.join("logs"))?;
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

/// Environment for git inside the sandbox: the agent controls the repository's config
/// and hooks, so pin what changes the patch's shape and never run hooks.
pub fn sandbox_env() -> Vec<(String, String)> {
    let config = [
        ("safe.directory", "*"),
        ("core.hooksPath", "/dev/null"),
        ("core.fsmonitor", "false"),
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
            let mut cmd = host_git();
            cmd.args(["check-ref-format", "--branch", good]);
            assert!(
                run(cmd, Duration::from_secs(10)).await.unwrap().is_ok(),
                "{good:?}"
            );
        }
    }
}
