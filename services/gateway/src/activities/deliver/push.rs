//! Forks' changes as commits on branches of the run's remote, made on the gateway's
//! host: never in a sandbox, which never holds the credential.
//!
//! A scratch bare repository fetches the forks' base commits (one fetch), makes each
//! fork's commit from its patch in an index of its own (`git apply --cached` onto the
//! base's tree: no worktree, nothing of the agent's runs as git configuration or hooks),
//! and pushes every branch in one `git push` (one connection, however many forks).
//!
//! Exactly once: a commit's author, committer and dates are the run's, so a retry makes
//! the very same commit id; each branch is pushed with a lease that it does not exist,
//! so a retry whose first attempt pushed it finds it "up to date", and a branch someone
//! else pushed is never forced over (that fork's delivery says so). A branch the push
//! reports not made is looked up on the remote: at the fork's very commit, it is
//! pushed (an earlier attempt's push, orphaned by a killed gateway, landed it under
//! this one; or the connection broke after the server took it).

use forkyard_common::host_git;
use std::{path::Path, time::Duration};

/// How long a fetch or a push may take.
const NETWORK_TIMEOUT: Duration = Duration::from_secs(300);
/// How long a local step (apply, commit) may take.
const LOCAL_TIMEOUT: Duration = Duration::from_secs(60);

/// How host git reaches the remote: its URL (never carrying a credential), the `-c`
/// settings that pin it to its checked addresses, the credential's environment.
pub struct Access {
    pub url: String,
    pub pin: Vec<String>,
    pub env: Vec<(String, String)>,
}

/// One fork's commit to make and push.
#[derive(Debug, Clone)]
pub struct Change {
    pub fork: u32,
    pub branch: String,
    pub base_commit: String,
    pub patch: String,
    pub message: String,
    pub author: Signature,
}

/// Who the commit names, and when (seconds since the epoch): fixed by the run.
#[derive(Debug, Clone)]
pub struct Signature {
    pub name: String,
    pub email: String,
    pub unix_secs: i64,
}

/// Each fork's pushed commit, or why it was not pushed.
pub type Pushed = Vec<(u32, Result<String, String>)>;

/// Make every change's commit in a scratch repository (the base commits fetched by
/// `from`) and push them all at once to `to`.
pub async fn push(from: &Access, to: &Access, changes: Vec<Change>) -> Pushed {
    let scratch = match tempfile::tempdir() {
        Ok(d) => d,
        Err(e) => return all_failed(&changes, &format!("no scratch directory: {e}")),
    };
    let dir = scratch.path();
    if let Err(why) = fetch_bases(from, dir, &changes).await {
        return all_failed(&changes, &why);
    }
    let mut made = Vec::new();
    let mut out = Pushed::new();
    for change in changes {
        match commit(dir, &change).await {
            Ok(id) => made.push((change.fork, change.branch, id)),
            Err(why) => out.push((change.fork, Err(why))),
        }
    }
    if !made.is_empty() {
        out.extend(push_all(to, dir, &made).await);
    }
    out.sort_by_key(|(fork, _)| *fork);
    out
}

fn all_failed(changes: &[Change], why: &str) -> Pushed {
    changes
        .iter()
        .map(|c| (c.fork, Err(why.to_owned())))
        .collect()
}

async fn git(
    dir: &Path,
    access: Option<&Access>,
    args: &[&str],
    input: Option<&[u8]>,
) -> Result<String, String> {
    let (pin, env) = access.map_or((&[][..], &[][..]), |a| (&a.pin[..], &a.env[..]));
    let mut cmd = host_git::command(pin, env);
    cmd.arg("--git-dir").arg(dir).args(args);
    for (k, v) in fixed_identity() {
        cmd.env(k, v);
    }
    let timeout = if access.is_some() {
        NETWORK_TIMEOUT
    } else {
        LOCAL_TIMEOUT
    };
    let out = host_git::output(cmd, input, timeout).await?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    } else {
        Err(host_git::reason(&out))
    }
}

/// git wants an identity even where none is used (the scratch repository's reflog).
fn fixed_identity() -> [(&'static str, &'static str); 2] {
    [
        ("GIT_COMMITTER_NAME", "forkyard"),
        ("GIT_COMMITTER_EMAIL", "forkyard@localhost"),
    ]
}

/// The scratch repository, with every base commit fetched in one fetch.
async fn fetch_bases(access: &Access, dir: &Path, changes: &[Change]) -> Result<(), String> {
    git(dir, None, &["init", "--quiet", "--bare"], None)
        .await
        .map_err(|e| format!("scratch repository: {e}"))?;
    let mut bases: Vec<&str> = changes.iter().map(|c| c.base_commit.as_str()).collect();
    bases.sort_unstable();
    bases.dedup();
    let mut args = vec![
        "fetch",
        "--quiet",
        "--no-tags",
        "--no-write-fetch-head",
        "--",
        &access.url,
    ];
    args.extend(bases.iter().copied());
    git(dir, Some(access), &args, None)
        .await
        .map(drop)
        .map_err(|e| format!("fetch of the base commit: {e}"))
}

/// The fork's commit: its patch applied onto its base's tree, in an index of its own.
async fn commit(dir: &Path, c: &Change) -> Result<String, String> {
    let index = dir.join(format!("index-{}", c.fork));
    let step = Step {
        dir,
        index: &index,
        author: &c.author,
    };
    step.run(&["read-tree", &c.base_commit], None)
        .await
        .map_err(|e| format!("base commit {}: {e}", c.base_commit))?;
    let apply = ["apply", "--cached", "--binary", "--whitespace=nowarn", "-"];
    step.run(&apply, Some(c.patch.as_bytes()))
        .await
        .map_err(|e| format!("the fork's patch does not apply to its base commit: {e}"))?;
    let tree = step.run(&["write-tree"], None).await?;
    let args = [
        "commit-tree",
        tree.as_str(),
        "-p",
        c.base_commit.as_str(),
        "-F",
        "-",
    ];
    step.run(&args, Some(c.message.as_bytes()))
        .await
        .map_err(|e| format!("commit: {e}"))
}

/// A local step of a fork's commit: its own index, the run's signature.
struct Step<'a> {
    dir: &'a Path,
    index: &'a Path,
    author: &'a Signature,
}

impl Step<'_> {
    async fn run(&self, args: &[&str], input: Option<&[u8]>) -> Result<String, String> {
        let mut cmd = host_git::command(&[], &[]);
        cmd.arg("--git-dir")
            .arg(self.dir)
            .args(["-c", "core.fsmonitor=false"])
            .args(args)
            .env("GIT_INDEX_FILE", self.index);
        for (k, v) in signature_env(self.author) {
            cmd.env(k, v);
        }
        let out = host_git::output(cmd, input, LOCAL_TIMEOUT).await?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
        } else {
            Err(host_git::reason(&out))
        }
    }
}

fn signature_env(s: &Signature) -> Vec<(&'static str, String)> {
    let date = format!("{} +0000", s.unix_secs);
    vec![
        ("GIT_AUTHOR_NAME", s.name.clone()),
        ("GIT_AUTHOR_EMAIL", s.email.clone()),
        ("GIT_AUTHOR_DATE", date.clone()),
        ("GIT_COMMITTER_NAME", s.name.clone()),
        ("GIT_COMMITTER_EMAIL", s.email.clone()),
        ("GIT_COMMITTER_DATE", date),
    ]
}

/// One push of every branch, each leased to be new; each branch's outcome from git's
/// porcelain report.
async fn push_all(access: &Access, dir: &Path, made: &[(u32, String, String)]) -> Pushed {
    let mut args: Vec<String> = vec![
        "push".into(),
        "--porcelain".into(),
        "--".into(),
        access.url.clone(),
    ];
    // Options before `--`; refspecs after the URL.
    for (_, branch, _) in made {
        args.insert(2, format!("--force-with-lease=refs/heads/{branch}:"));
    }
    for (_, branch, commit) in made {
        args.push(format!("{commit}:refs/heads/{branch}"));
    }
    let mut cmd = host_git::command(&access.pin, &access.env);
    cmd.arg("--git-dir").arg(dir).args(&args);
    let out = match host_git::output(cmd, None, NETWORK_TIMEOUT).await {
        Ok(out) => out,
        Err(e) => {
            return made
                .iter()
                .map(|(f, ..)| (*f, Err(format!("push: {e}"))))
                .collect();
        }
    };
    let report = String::from_utf8_lossy(&out.stdout);
    let whole = host_git::reason(&out);
    let pushed = made
        .iter()
        .map(|(fork, branch, commit)| {
            let line = porcelain_line(&report, branch);
            (*fork, outcome(line, branch, commit, &whole))
        })
        .collect();
    landed_anyway(access, made, pushed).await
}

/// `pushed` with each branch reported not pushed, but at its fork's commit on the
/// remote, counted as pushed: all of them looked up in one `ls-remote`.
async fn landed_anyway(
    access: &Access,
    made: &[(u32, String, String)],
    mut pushed: Pushed,
) -> Pushed {
    let failed: Vec<&(u32, String, String)> = made
        .iter()
        .filter(|(fork, ..)| pushed.iter().any(|(f, r)| f == fork && r.is_err()))
        .collect();
    if failed.is_empty() {
        return pushed;
    }
    let refs: Vec<String> = failed
        .iter()
        .map(|(_, b, _)| format!("refs/heads/{b}"))
        .collect();
    let mut cmd = host_git::command(&access.pin, &access.env);
    cmd.args(["ls-remote", "--", &access.url]).args(&refs);
    let Ok(out) = host_git::output(cmd, None, NETWORK_TIMEOUT).await else {
        return pushed;
    };
    let listed = String::from_utf8_lossy(&out.stdout);
    for (fork, branch, commit) in failed {
        let there = format!("{commit}\trefs/heads/{branch}");
        if out.status.success() && listed.lines().any(|l| l.trim_end() == there) {
            tracing::info!(fork, branch = %branch, "branch already at the fork's commit: an earlier push landed it");
            if let Some((_, r)) = pushed.iter_mut().find(|(f, _)| f == fork) {
                *r = Ok(commit.clone());
            }
        }
    }
    pushed
}

/// The remote's default branch (what its HEAD names), for pull requests of a run whose
/// base was no branch.
pub async fn default_branch(access: &Access) -> Result<String, String> {
    let mut cmd = host_git::command(&access.pin, &access.env);
    cmd.args(["ls-remote", "--symref", "--", &access.url, "HEAD"]);
    let out = host_git::output(cmd, None, NETWORK_TIMEOUT).await?;
    if !out.status.success() {
        return Err(format!(
            "the remote's default branch: {}",
            host_git::reason(&out)
        ));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find_map(|l| {
            l.strip_prefix("ref: refs/heads/")?
                .split_once('\t')
                .map(|(b, _)| b.to_owned())
        })
        .ok_or_else(|| "the remote's HEAD names no branch: give the run a base_ref".to_owned())
}

/// The porcelain line of `refs/heads/<branch>`: `<flag>\t<from>:<to>\t<summary>`.
fn porcelain_line<'a>(report: &'a str, branch: &str) -> Option<&'a str> {
    let to = format!(":refs/heads/{branch}\t");
    report.lines().find(|l| l.contains(&to))
}

fn outcome(line: Option<&str>, branch: &str, commit: &str, whole: &str) -> Result<String, String> {
    let Some(line) = line else {
        return Err(format!("push: {whole}"));
    };
    match line.chars().next() {
        // New, fast-forwarded, or already there (a retry of a push that landed).
        Some('*' | ' ' | '=' | '+') => Ok(commit.to_owned()),
        _ if line.contains("(stale info)")
            || line.contains("(fetch first)")
            || line.contains("(non-fast-forward)") =>
        {
            Err(format!(
                "branch {branch} already exists on the remote at another commit; not forced over (someone else's work)"
            ))
        }
        _ => {
            let summary = line.rsplit('\t').next().unwrap_or(line).trim();
            Err(format!("push of branch {branch} refused: {summary}"))
        }
    }
}

#[cfg(test)]
#[path = "push_tests.rs"]
mod tests;
