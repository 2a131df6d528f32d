//! `forkyard result --winner` and `forkyard apply`: a fork's patch onto the checkout
//! here, as `git apply --index`, refused on a dirty tree (unless --force) and for a
//! patch cut short.

mod common;

use common::{Fake, forkyard, ok, stderr};
use forkyard_proto::{
    common::v1::{ForkResult, ForkStatus},
    gateway::v1::{Run, RunState},
};
use std::{path::Path, process::Command};

fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .args(["-c", "user.name=t", "-c", "user.email=t@example.com"])
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "git {args:?}: {}", stderr(&out));
    String::from_utf8(out.stdout).unwrap()
}

/// A checkout with one commit, and the patch a fork made on it (a line added to
/// README, a new file): (checkout, base commit, patch).
fn checkout_and_patch() -> (tempfile::TempDir, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    git(d, &["init", "-q", "-b", "main"]);
    std::fs::write(d.join("README"), "hello\n").unwrap();
    git(d, &["add", "."]);
    git(d, &["commit", "-qm", "base"]);
    let base = git(d, &["rev-parse", "HEAD"]).trim().to_owned();
    std::fs::write(d.join("README"), "hello\nfrom fork 2\n").unwrap();
    std::fs::write(d.join("NEW.md"), "new\n").unwrap();
    git(d, &["add", "-N", "NEW.md"]);
    let patch = git(d, &["diff", "--binary"]);
    // (An intent-to-add file goes with the reset.)
    git(d, &["reset", "-q", "--hard"]);
    assert!(!d.join("NEW.md").exists());
    (dir, base, patch)
}

fn fork(n: u32, status: ForkStatus, base: &str, patch: &str) -> ForkResult {
    ForkResult {
        fork: n,
        status: status as i32,
        base_commit: base.to_owned(),
        patch: patch.to_owned(),
        patch_bytes: patch.len() as u64,
        ..Default::default()
    }
}

/// run-1: completed, fork 2 its winner, fork 3's patch cut short; run-2 failed with no
/// winner; run-3 still running, no fork done.
async fn gateway(base: &str, patch: &str) -> String {
    let fake = Fake::default();
    {
        let mut c = fake.0.lock().unwrap();
        let run = |id: &str, state: RunState, winner: u32| Run {
            run_id: id.into(),
            state: state as i32,
            winner,
            ..Default::default()
        };
        c.runs = vec![
            run("run-1", RunState::Completed, 2),
            run("run-2", RunState::Failed, 0),
            run("run-3", RunState::Running, 0),
        ];
        let mut cut = fork(3, ForkStatus::Succeeded, base, &patch[..patch.len() / 2]);
        cut.patch_truncated = true;
        cut.patch_bytes = 70 << 20;
        for f in [
            fork(1, ForkStatus::Failed, base, ""),
            fork(2, ForkStatus::Succeeded, base, patch),
            cut,
        ] {
            c.forks.insert(("run-1".into(), f.fork), f);
        }
    }
    fake.serve().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn result_winner_is_the_runs_best_fork() {
    let (_dir, base, patch) = checkout_and_patch();
    let gw = gateway(&base, &patch).await;
    let out = forkyard(
        &[
            "--gateway",
            &gw,
            "result",
            "run-1",
            "--winner",
            "--jq",
            ".fork",
        ],
        &[],
        None,
    );
    assert_eq!(ok(&out, 0), "2\n");
    let out = forkyard(
        &["--gateway", &gw, "result", "run-2", "--winner"],
        &[],
        None,
    );
    ok(&out, 1);
    assert!(
        stderr(&out).contains("run-2 has no winner: it ended failed"),
        "{}",
        stderr(&out)
    );
    let out = forkyard(
        &["--gateway", &gw, "result", "run-3", "--winner"],
        &[],
        None,
    );
    ok(&out, 1);
    assert!(
        stderr(&out).contains("has no winner yet: it is running"),
        "{}",
        stderr(&out)
    );
    // A fork or --winner, not both, not neither.
    let out = forkyard(
        &["--gateway", &gw, "result", "run-1", "2", "--winner"],
        &[],
        None,
    );
    ok(&out, 64);
    let out = forkyard(&["--gateway", &gw, "result", "run-1"], &[], None);
    ok(&out, 64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apply_puts_the_winners_patch_in_the_files_and_the_index() {
    let (dir, base, patch) = checkout_and_patch();
    let gw = gateway(&base, &patch).await;
    let d = dir.path();
    // From a subdirectory too: the patch's paths are the checkout's.
    std::fs::create_dir(d.join("sub")).unwrap();
    let out = forkyard(
        &["--gateway", &gw, "apply", "run-1"],
        &[],
        Some(&d.join("sub")),
    );
    ok(&out, 0);
    assert!(
        stderr(&out).contains("applied fork 2 of run-1"),
        "{}",
        stderr(&out)
    );
    assert_eq!(
        std::fs::read_to_string(d.join("README")).unwrap(),
        "hello\nfrom fork 2\n"
    );
    assert_eq!(
        git(d, &["diff", "--cached", "--name-only"]),
        "NEW.md\nREADME\n"
    );
    assert_eq!(
        git(d, &["diff", "--name-only"]),
        "",
        "files and index agree"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apply_refuses_a_dirty_tree_unless_forced() {
    let (dir, base, patch) = checkout_and_patch();
    let gw = gateway(&base, &patch).await;
    let d = dir.path();
    std::fs::write(d.join("OTHER"), "mine\n").unwrap();
    git(d, &["add", "OTHER"]);
    let out = forkyard(&["--gateway", &gw, "apply", "run-1", "2"], &[], Some(d));
    ok(&out, 1);
    let e = stderr(&out);
    assert!(
        e.contains("uncommitted changes (OTHER)") && e.contains("--force"),
        "{e}"
    );
    assert_eq!(
        std::fs::read_to_string(d.join("README")).unwrap(),
        "hello\n"
    );

    let out = forkyard(
        &["--gateway", &gw, "apply", "run-1", "2", "--force"],
        &[],
        Some(d),
    );
    ok(&out, 0);
    assert_eq!(
        git(d, &["diff", "--cached", "--name-only"]),
        "NEW.md\nOTHER\nREADME\n"
    );

    // Applied already: git says why it does not apply again, and nothing changes.
    let out = forkyard(
        &["--gateway", &gw, "apply", "run-1", "--force"],
        &[],
        Some(d),
    );
    ok(&out, 1);
    let e = stderr(&out);
    assert!(
        e.contains("git apply refused the patch of fork 2 of run-1"),
        "{e}"
    );
    assert!(e.contains("already exists"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apply_refuses_a_patch_cut_short_and_says_what_else_is_wrong() {
    let (dir, base, patch) = checkout_and_patch();
    let gw = gateway(&base, &patch).await;
    let d = dir.path();
    let out = forkyard(&["--gateway", &gw, "apply", "run-1", "3"], &[], Some(d));
    ok(&out, 1);
    let e = stderr(&out);
    assert!(
        e.contains("the patch of fork 3 of run-1 was cut short"),
        "{e}"
    );
    assert!(e.contains("forkyard publish run-1 3"), "{e}");
    assert_eq!(git(d, &["status", "--porcelain"]), "");

    let out = forkyard(&["--gateway", &gw, "apply", "run-1", "1"], &[], Some(d));
    ok(&out, 0);
    assert!(
        stderr(&out).contains("fork 1 of run-1 changed nothing"),
        "{}",
        stderr(&out)
    );

    let out = forkyard(&["--gateway", &gw, "apply", "run-2"], &[], Some(d));
    ok(&out, 1);
    assert!(
        stderr(&out).contains("run-2 has no winner"),
        "{}",
        stderr(&out)
    );

    let out = forkyard(&["--gateway", &gw, "apply", "run-1", "9"], &[], Some(d));
    ok(&out, 1);
    assert!(stderr(&out).contains("not found"), "{}", stderr(&out));

    let nowhere = tempfile::tempdir().unwrap();
    let out = forkyard(
        &["--gateway", &gw, "apply", "run-1"],
        &[],
        Some(nowhere.path()),
    );
    ok(&out, 1);
    assert!(
        stderr(&out).contains("not in a git checkout"),
        "{}",
        stderr(&out)
    );
}
