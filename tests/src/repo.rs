//! Small git repositories for tests and the demo.

use std::{path::Path, process::Command};

fn git(dir: &Path, args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new("git").args(args).current_dir(dir).output()?;
    anyhow::ensure!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// A repo with one commit holding `README.md` and `src/lib.txt`; returns the commit.
pub fn create(dir: &Path) -> anyhow::Result<String> {
    std::fs::create_dir_all(dir.join("src"))?;
    git(dir, &["init", "-q", "-b", "main"])?;
    git(dir, &["config", "user.name", "Forkyard Test"])?;
    git(dir, &["config", "user.email", "test@forkyard.invalid"])?;
    std::fs::write(dir.join("README.md"), "# demo\n")?;
    std::fs::write(dir.join("src/lib.txt"), "one\ntwo\nthree\n")?;
    git(dir, &["add", "-A"])?;
    git(dir, &["commit", "-q", "-m", "initial"])?;
    git(dir, &["rev-parse", "HEAD"])
}

/// Commit everything in `dir` with `message`; returns the commit.
pub fn commit_all(dir: &Path, message: &str) -> anyhow::Result<String> {
    git(dir, &["add", "-A"])?;
    git(dir, &["commit", "-q", "-m", message])?;
    git(dir, &["rev-parse", "HEAD"])
}
