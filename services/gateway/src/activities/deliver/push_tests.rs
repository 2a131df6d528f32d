use super::*;

/// `git <args>` in `dir`, which must succeed: its trimmed output.
fn git_ok(dir: &Path, args: &[&str]) -> String {
    let out = std::process::Command::new("git")
        .args([
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@t",
            "-c",
            "init.defaultBranch=main",
        ])
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

#[tokio::test]
async fn a_branch_reported_refused_but_at_the_forks_commit_is_pushed() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    git_ok(d, &["init", "-q", "work"]);
    let work = d.join("work");
    git_ok(&work, &["commit", "-q", "--allow-empty", "-m", "fork"]);
    let ours = git_ok(&work, &["rev-parse", "HEAD"]);
    git_ok(
        &work,
        &["commit", "-q", "--allow-empty", "-m", "someone else"],
    );
    let theirs = git_ok(&work, &["rev-parse", "HEAD"]);
    git_ok(d, &["init", "-q", "--bare", "remote.git"]);
    // Landed by an earlier push: fork 1's branch at its commit; fork 2's at another.
    git_ok(
        &work,
        &[
            "push",
            "-q",
            "../remote.git",
            &format!("{ours}:refs/heads/b-1"),
        ],
    );
    git_ok(
        &work,
        &[
            "push",
            "-q",
            "../remote.git",
            &format!("{theirs}:refs/heads/b-2"),
        ],
    );
    let access = Access {
        url: d.join("remote.git").display().to_string(),
        pin: Vec::new(),
        env: Vec::new(),
    };
    let made = [
        (1, "b-1".to_owned(), ours.clone()),
        (2, "b-2".to_owned(), ours.clone()),
        (3, "b-3".to_owned(), ours.clone()),
    ];
    let refused = |f| {
        (
            f,
            Err("push of branch refused: [remote rejected] (failed to update ref)".to_owned()),
        )
    };
    let pushed = landed_anyway(&access, &made, vec![refused(1), refused(2), refused(3)]).await;
    assert_eq!(pushed[0], (1, Ok(ours)));
    assert!(
        pushed[1].1.is_err(),
        "another commit is not ours: {pushed:?}"
    );
    assert!(pushed[2].1.is_err(), "no branch is not pushed: {pushed:?}");
}

#[test]
fn porcelain_lines_say_each_branchs_fate() {
    let report = "To http://h/r.git\n*\tc1:refs/heads/a-fork-1\t[new branch]\n=\tc2:refs/heads/a-fork-2\t[up to date]\n!\tc3:refs/heads/a-fork-3\t[rejected] (stale info)\n!\tc4:refs/heads/a-fork-4\t[remote rejected] (protected branch hook declined)\nDone\n";
    let at = |b| outcome(porcelain_line(report, b), b, "c", "fatal: x");
    assert_eq!(at("a-fork-1"), Ok("c".into()));
    assert_eq!(at("a-fork-2"), Ok("c".into()));
    assert!(at("a-fork-3").unwrap_err().contains("not forced over"));
    assert!(
        at("a-fork-4")
            .unwrap_err()
            .contains("protected branch hook declined")
    );
    assert_eq!(at("a-fork-5"), Err("push: fatal: x".into()));
    // A branch whose name is a prefix of another's is not mistaken for it.
    assert_eq!(porcelain_line(report, "a-fork"), None);
}
