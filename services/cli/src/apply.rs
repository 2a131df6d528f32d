//! `forkyard apply` (a fork's patch onto the git checkout here) and the run's winner,
//! which it and `result --winner` default to.

use crate::client::{Client, status_error};
use forkyard_proto::{
    common::v1::{ForkResult, ForkStatus},
    gateway::v1::{GetForkResultRequest, GetRunRequest, RunState},
};
use std::{
    io::Write as _,
    path::{Path, PathBuf},
    process::{Command, ExitCode, Stdio},
};

/// The run's winner: its best fork (Run.winner). A run still going has a winner so far,
/// said on stderr; a run without one is an error saying why.
pub async fn winner(client: &mut Client, run_id: &str) -> anyhow::Result<u32> {
    let run = client
        .get_run(GetRunRequest {
            run_id: run_id.to_owned(),
        })
        .await
        .map_err(status_error)?
        .into_inner();
    let state = RunState::try_from(run.state).unwrap_or_default();
    let going = matches!(
        state,
        RunState::Running | RunState::Paused | RunState::AwaitingBudget
    );
    match (run.winner, going) {
        (0, true) => anyhow::bail!(
            "run {run_id} has no winner yet: it is {} and no fork has succeeded (`forkyard watch {run_id}`)",
            crate::table::run_state(run.state)
        ),
        (0, false) => anyhow::bail!(
            "run {run_id} has no winner: it ended {} with no fork succeeded",
            crate::table::run_state(run.state)
        ),
        (w, true) => {
            eprintln!("run {run_id} is still going: fork {w} is its winner so far");
            Ok(w)
        }
        (w, false) => Ok(w),
    }
}

/// Apply fork `fork` (default: the winner) of `run_id` to the checkout around the
/// working directory, files and index, as `git apply --index` does: all or nothing.
pub async fn apply(
    client: &mut Client,
    run_id: String,
    fork: Option<u32>,
    force: bool,
) -> anyhow::Result<ExitCode> {
    // The checkout is looked at before the gateway, so a wrong directory fails at once.
    let top = toplevel()?;
    if !force {
        clean(&top)?;
    }
    let fork = match fork {
        Some(f) => f,
        None => winner(client, &run_id).await?,
    };
    let f = client
        .get_fork_result(GetForkResultRequest {
            run_id: run_id.clone(),
            fork,
        })
        .await
        .map_err(status_error)?
        .into_inner();
    let what = format!("fork {fork} of {run_id}");
    check_patch(&f, &what, &run_id)?;
    if f.patch.is_empty() {
        eprintln!("{what} changed nothing: nothing to apply");
        return Ok(ExitCode::SUCCESS);
    }
    warn_base(&top, &f.base_commit, &what);
    git_apply(&top, &f.patch).map_err(|why| {
        anyhow::anyhow!(
            "git apply refused the patch of {what} in {}: {why}",
            top.display()
        )
    })?;
    eprintln!(
        "applied {what} to {}: {}, staged (`git diff --cached` shows it)",
        top.display(),
        crate::table::diffstat(&f)
    );
    Ok(ExitCode::SUCCESS)
}

/// What stops or warns before the patch is tried: a patch cut short is refused (applied,
/// it would silently leave changes out); a fork that failed or left files out is said.
fn check_patch(f: &ForkResult, what: &str, run_id: &str) -> anyhow::Result<()> {
    anyhow::ensure!(
        !f.patch_truncated,
        "the patch of {what} was cut short ({} of {} bytes kept): applying it would leave \
         changes out; push the fork as a branch instead (`forkyard publish {run_id} {}`)",
        f.patch.len(),
        f.patch_bytes,
        f.fork
    );
    if f.status != ForkStatus::Succeeded as i32 {
        eprintln!(
            "warning: {what} did not succeed ({}): applying what it changed anyway",
            crate::table::fork_status(f.status)
        );
    }
    if !f.patch_skipped_files.is_empty() {
        eprintln!(
            "warning: the patch of {what} leaves out files too large for it: {}",
            f.patch_skipped_files.join(", ")
        );
    }
    Ok(())
}

fn git(dir: &Path, args: &[&str]) -> Result<String, String> {
    let out = Command::new("git")
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("git: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim_end().to_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_owned())
    }
}

/// The top of the git checkout around the working directory.
fn toplevel() -> anyhow::Result<PathBuf> {
    let cwd = std::env::current_dir()?;
    git(&cwd, &["rev-parse", "--show-toplevel"])
        .map(PathBuf::from)
        .map_err(|why| anyhow::anyhow!("not in a git checkout ({}): {why}", cwd.display()))
}

/// Refuse a checkout whose tracked files or index have changes: the patch would mix
/// with them. Untracked files do not count (git apply stops on one it would overwrite).
fn clean(top: &Path) -> anyhow::Result<()> {
    let status = git(top, &["status", "--porcelain", "--untracked-files=no"])
        .map_err(|why| anyhow::anyhow!("git status in {}: {why}", top.display()))?;
    let changed: Vec<&str> = status.lines().map(|l| l.get(3..).unwrap_or(l)).collect();
    if changed.is_empty() {
        return Ok(());
    }
    let shown: Vec<&str> = changed.iter().take(5).copied().collect();
    let more = if changed.len() > 5 { ", …" } else { "" };
    anyhow::bail!(
        "the checkout at {} has uncommitted changes ({}{more}): commit or stash them, or --force",
        top.display(),
        shown.join(", ")
    )
}

/// Say when the checkout is not at the fork's base: the patch may still apply.
fn warn_base(top: &Path, base: &str, what: &str) {
    if base.is_empty() {
        return;
    }
    let short = &base[..base.len().min(12)];
    if git(top, &["cat-file", "-e", &format!("{base}^{{commit}}")]).is_err() {
        eprintln!(
            "warning: {what} was made on commit {short}, which this repository does not have: is it the run's repository?"
        );
    } else if git(top, &["rev-parse", "HEAD"]).is_ok_and(|head| head != base) {
        eprintln!("note: {what} was made on commit {short}; this checkout is elsewhere");
    }
}

/// `git apply --index` of `patch`, given on its standard input.
fn git_apply(top: &Path, patch: &str) -> Result<(), String> {
    let mut child = Command::new("git")
        .args(["apply", "--index", "-"])
        .current_dir(top)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("git: {e}"))?;
    let mut stdin = child.stdin.take().ok_or("git: no standard input")?;
    // Written from a thread: git may answer (and stop reading) before it has all of it.
    let patch = patch.to_owned();
    let writer = std::thread::spawn(move || stdin.write_all(patch.as_bytes()));
    let out = child.wait_with_output().map_err(|e| format!("git: {e}"))?;
    let _ = writer.join();
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_owned())
    }
}
