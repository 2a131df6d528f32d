//! Workspace templates against real git repositories in temp dirs.

use super::{marks::SETTLED, *};
use forkyard_common::git_refs::local_commit;
use std::{os::unix::fs::PermissionsExt, process::Command};

pub(super) fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

pub(super) fn repo(dir: &Path) -> PathBuf {
    let r = dir.join("src");
    std::fs::create_dir_all(r.join("bin")).unwrap();
    git(&r, &["init", "-q", "-b", "main"]);
    git(&r, &["config", "user.email", "t@example.com"]);
    git(&r, &["config", "user.name", "t"]);
    std::fs::write(r.join("README.md"), "hello\n").unwrap();
    std::fs::write(r.join("bin/run.sh"), "#!/bin/sh\necho run\n").unwrap();
    std::fs::set_permissions(r.join("bin/run.sh"), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::os::unix::fs::symlink("README.md", r.join("link")).unwrap();
    git(&r, &["add", "-A"]);
    git(&r, &["commit", "-q", "-m", "one"]);
    r
}

#[test]
fn commits_are_read_from_ref_files_or_left_to_git() {
    let tmp = tempfile::tempdir().unwrap();
    let r = repo(tmp.path());
    let head = git(&r, &["rev-parse", "HEAD"]);
    let path = r.to_str().unwrap();
    assert_eq!(local_commit(path, "").as_deref(), Some(head.as_str()));
    assert_eq!(local_commit(path, "HEAD").as_deref(), Some(head.as_str()));
    assert_eq!(local_commit(path, "main").as_deref(), Some(head.as_str()));
    assert_eq!(local_commit(path, &head).as_deref(), Some(head.as_str()));
    // packed refs are read too
    git(&r, &["branch", "side"]);
    git(&r, &["pack-refs", "--all"]);
    assert_eq!(local_commit(path, "side").as_deref(), Some(head.as_str()));
    // what needs git: expressions, short ids, tags (peeling), unknown names, URLs
    git(&r, &["tag", "-a", "-m", "t", "v1"]);
    git(&r, &["branch", "v1"]);
    for r#ref in ["HEAD~1", &head[..7], "v1", "nope", "../../HEAD"] {
        assert_eq!(local_commit(path, r#ref), None, "{ref:?}");
    }
    assert_eq!(local_commit("https://example.com/r.git", ""), None);
    assert_eq!(local_commit("git@example.com:r.git", ""), None);
}

#[tokio::test]
async fn workspaces_are_independent_copies_on_their_branch() {
    let tmp = tempfile::tempdir().unwrap();
    let r = repo(tmp.path());
    let path = r.to_str().unwrap();
    let t = Templates::open(tmp.path().join("templates"), 0).unwrap();
    let commit = local_commit(path, "").unwrap();
    let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
    let timeout = Duration::from_secs(60);
    t.workspace(path, &commit, "fork-1", &a, timeout)
        .await
        .unwrap();
    t.workspace(path, &commit, "fork-2", &b, timeout)
        .await
        .unwrap();

    assert_eq!(git(&a, &["rev-parse", "--abbrev-ref", "HEAD"]), "fork-1");
    assert_eq!(git(&b, &["rev-parse", "--abbrev-ref", "HEAD"]), "fork-2");
    checked_out_as_a_clone(&a, path, &commit);
    changes_stay_in_their_workspace(&t, path, &commit, &a, &b, tmp.path()).await;
    taken_branches_are_refused(&t, path, &commit, tmp.path()).await;
    a_new_commit_replaces_the_template(&t, &r, &commit, tmp.path()).await;
}

/// A template's copy at `commit` is a clean checkout, as a clone of `origin` would be,
/// without what the clone kept of the host.
fn checked_out_as_a_clone(a: &Path, origin: &str, commit: &str) {
    assert_eq!(git(a, &["rev-parse", "HEAD"]), commit);
    assert_eq!(
        git(a, &["status", "--porcelain"]),
        "",
        "the copy is a clean checkout"
    );
    assert_eq!(git(a, &["remote", "get-url", "origin"]), origin);
    let mode = std::fs::metadata(a.join("bin/run.sh"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o111, 0o111, "executable bits survive");
    assert_eq!(
        std::fs::read_link(a.join("link")).unwrap(),
        Path::new("README.md")
    );
    assert!(
        a.join(".git/hooks").is_dir(),
        "hooks/ exists, as in a clone"
    );
    let samples = std::fs::read_dir(a.join(".git/hooks")).unwrap().count();
    assert_eq!(samples, 0, "no hook samples are copied");
    assert!(
        !a.join(".git/logs").exists(),
        "the clone's reflogs (naming the host's path) are not copied"
    );
    assert!(a.join(".git/info").is_dir(), "info/ exists, as in a clone");
}

/// Changing one workspace's files and git objects changes nothing elsewhere.
async fn changes_stay_in_their_workspace(
    t: &Templates,
    path: &str,
    commit: &str,
    a: &Path,
    b: &Path,
    tmp: &Path,
) {
    let timeout = Duration::from_secs(60);
    std::fs::write(a.join("README.md"), "changed\n").unwrap();
    git(
        a,
        &[
            "-c",
            "user.name=a",
            "-c",
            "user.email=a@b",
            "commit",
            "-qam",
            "a",
        ],
    );
    // git makes what the template left out again when it needs it.
    assert!(git(a, &["reflog", "-n1"]).contains("commit: a"));
    git(a, &["tag", "v0"]);
    assert_eq!(git(a, &["tag", "--list"]), "v0");
    git(a, &["fsck", "--no-progress"]);
    let objects = walk(&a.join(".git/objects"));
    assert!(!objects.is_empty());
    for e in objects {
        std::fs::set_permissions(&e, std::fs::Permissions::from_mode(0o644)).unwrap();
        std::fs::write(e, "garbage").unwrap();
    }
    assert_eq!(
        std::fs::read_to_string(b.join("README.md")).unwrap(),
        "hello\n"
    );
    git(b, &["fsck", "--no-progress"]);
    let c = tmp.join("c");
    t.workspace(path, commit, "fork-3", &c, timeout)
        .await
        .unwrap();
    git(&c, &["fsck", "--no-progress"]);
}

/// A branch that exists already is refused, as `git checkout -b` would; so is one
/// under an existing branch (packed in the template), and one over existing branches.
async fn taken_branches_are_refused(t: &Templates, path: &str, commit: &str, tmp: &Path) {
    let timeout = Duration::from_secs(60);
    for (n, taken) in ["main", "main/x", "origin"].into_iter().enumerate() {
        let ws = tmp.join(format!("d{n}"));
        if taken == "origin" {
            t.workspace(path, commit, "origin/a", &ws, timeout)
                .await
                .unwrap();
            let err = start_branch(&ws, "origin", commit, None);
            assert!(
                matches!(&err, Err(ProvisionerError::FailedPrecondition(m)) if m.contains("refs/heads/origin/")),
                "{err:?}"
            );
            continue;
        }
        let err = t.workspace(path, commit, taken, &ws, timeout).await;
        assert!(
            matches!(&err, Err(ProvisionerError::FailedPrecondition(m)) if m.contains("'main") || m.contains("'refs/heads/main'")),
            "{taken}: {err:?}"
        );
    }
}

/// A new commit makes a new template; the old one goes.
async fn a_new_commit_replaces_the_template(t: &Templates, r: &Path, commit: &str, tmp: &Path) {
    let timeout = Duration::from_secs(60);
    let path = r.to_str().unwrap();
    std::fs::write(r.join("README.md"), "two\n").unwrap();
    git(r, &["commit", "-qam", "two"]);
    let newer = local_commit(path, "main").unwrap();
    assert_ne!(newer, commit);
    let e = tmp.join("e");
    t.workspace(path, &newer, "fork-4", &e, timeout)
        .await
        .unwrap();
    assert_eq!(
        std::fs::read_to_string(e.join("README.md")).unwrap(),
        "two\n"
    );
    let names: Vec<String> = std::fs::read_dir(tmp.join("templates"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names.len(), 1, "{names:?}");
    assert!(names[0].ends_with(&newer), "{names:?}");
}

pub(super) fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

/// Every template file has an mtime of its own: one moved or copied with its times over
/// another of the same size still differs from the index entry it lands on, under the
/// sandbox's git settings (which compare only mtime seconds, size and mode).
#[tokio::test]
async fn a_file_moved_over_another_of_its_size_is_still_a_change() {
    let tmp = tempfile::tempdir().unwrap();
    let r = repo(tmp.path());
    std::fs::write(r.join("a.txt"), "aaa\n").unwrap();
    std::fs::write(r.join("b.txt"), "bbb\n").unwrap();
    git(&r, &["add", "-A"]);
    git(&r, &["commit", "-q", "-m", "two"]);
    let path = r.to_str().unwrap();
    let t = Templates::open(tmp.path().join("templates"), 0).unwrap();
    let commit = local_commit(path, "").unwrap();
    let ws = tmp.path().join("ws");
    t.workspace(path, &commit, "fork-1", &ws, Duration::from_secs(60))
        .await
        .unwrap();
    moved_over_is_a_change(&ws, &commit);

    // A template an older provisioner built (every file checked out in one second, no
    // marker) is settled at its next use.
    let dir = t
        .ensure(path, &commit, Duration::from_secs(60))
        .await
        .unwrap();
    std::fs::remove_file(dir.join(SETTLED)).unwrap();
    let second = std::time::SystemTime::now() - Duration::from_secs(60);
    for f in ["a.txt", "b.txt"] {
        std::fs::File::options()
            .write(true)
            .open(dir.join("workspace").join(f))
            .unwrap()
            .set_modified(second)
            .unwrap();
    }
    git(&dir.join("workspace"), &["update-index", "--refresh"]);
    let ws = tmp.path().join("ws2");
    t.workspace(path, &commit, "fork-2", &ws, Duration::from_secs(60))
        .await
        .unwrap();
    assert!(dir.join(SETTLED).is_file());
    moved_over_is_a_change(&ws, &commit);
}

/// `b.txt` moved over `a.txt` (same size) in `ws`, as the sandbox's git sees it.
fn moved_over_is_a_change(ws: &Path, commit: &str) {
    std::fs::rename(ws.join("b.txt"), ws.join("a.txt")).unwrap();
    let sandbox_git = |args: &[&str]| {
        let out = Command::new("git")
            .current_dir(ws)
            .envs(crate::git::sandbox_env())
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success(), "git {args:?}: {out:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    sandbox_git(&["add", "-A"]);
    assert_eq!(
        sandbox_git(&["diff", "--cached", "--name-status", commit]),
        "M\ta.txt\nD\tb.txt\n"
    );
}
