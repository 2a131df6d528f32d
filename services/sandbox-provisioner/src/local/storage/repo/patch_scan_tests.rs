//! What the host reads of a workspace, against real trees and git repositories: files
//! over the limit (never through a link out), a stale index lock, whether every file is
//! tracked, and a workspace as made told from any change an agent can make.

use super::*;
use crate::local::storage::template;
use std::{
    ffi::OsString,
    os::unix::{
        ffi::OsStringExt,
        fs::{PermissionsExt as _, symlink},
    },
};

fn as_path(p: &[u8]) -> OsString {
    OsString::from_vec(p.to_vec())
}

fn tree() -> tempfile::TempDir {
    let t = tempfile::tempdir().unwrap();
    let w = t.path();
    std::fs::create_dir_all(w.join(".git/objects")).unwrap();
    std::fs::write(w.join(".git/objects/big"), vec![0u8; 300]).unwrap();
    std::fs::create_dir_all(w.join("src/deep")).unwrap();
    std::fs::write(w.join("small.txt"), b"hi").unwrap();
    std::fs::write(w.join("src/deep/big.bin"), vec![0u8; 200]).unwrap();
    std::fs::write(w.join("exactly.bin"), vec![0u8; 100]).unwrap();
    std::fs::create_dir(w.join("sub")).unwrap();
    std::fs::create_dir(w.join("sub/.git")).unwrap();
    std::fs::write(w.join("sub/.git/pack"), vec![0u8; 101]).unwrap();
    t
}

#[test]
fn names_files_over_the_limit_but_not_the_workspaces_own_git() {
    let t = tree();
    let mut found: Vec<_> = scan(t.path(), 100, None)
        .unwrap()
        .too_large
        .iter()
        .map(|p| as_path(p))
        .collect();
    found.sort();
    // Larger than, as `find -size +100c`: 100 bytes exactly stays in; a nested
    // repository's .git is the agent's like any other directory.
    assert_eq!(found, ["src/deep/big.bin", "sub/.git/pack"]);
}

#[test]
fn never_follows_a_symlink_out_of_the_workspace() {
    let t = tree();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("huge"), vec![0u8; 1000]).unwrap();
    symlink(outside.path(), t.path().join("escape")).unwrap();
    symlink(outside.path().join("huge"), t.path().join("link-to-huge")).unwrap();
    let found = scan(t.path(), 100, None).unwrap().too_large;
    assert!(
        !found
            .iter()
            .any(|p| p.starts_with(b"escape") || p.starts_with(b"link")),
        "{found:?}"
    );
}

#[test]
fn a_git_that_is_not_a_plain_directory_is_left_to_the_sandbox() {
    let t = tree();
    std::fs::rename(t.path().join(".git"), t.path().join("real-git")).unwrap();
    symlink("real-git", t.path().join(".git")).unwrap();
    assert_eq!(scan(t.path(), 100, None), None);
    std::fs::remove_file(t.path().join(".git")).unwrap();
    std::fs::write(t.path().join(".git"), b"gitdir: real-git\n").unwrap();
    assert_eq!(scan(t.path(), 100, None), None);
}

#[test]
fn only_a_stale_index_lock_is_removed() {
    let t = tree();
    let lock = t.path().join(".git/index.lock");
    std::fs::write(&lock, b"").unwrap();
    scan(t.path(), 100, None).unwrap();
    assert!(lock.exists(), "a fresh lock may be a running git's");
    let minute_ago = SystemTime::now() - Duration::from_secs(60);
    std::fs::File::options()
        .write(true)
        .open(&lock)
        .unwrap()
        .set_modified(minute_ago)
        .unwrap();
    scan(t.path(), 100, None).unwrap();
    assert!(!lock.exists());
}

fn git(dir: &Path, args: &[&str]) {
    let ok = std::process::Command::new("git")
        .current_dir(dir)
        .args(["-c", "user.name=t", "-c", "user.email=t@t"])
        .args(args)
        .status()
        .unwrap()
        .success();
    assert!(ok, "git {args:?}");
}

#[test]
fn knows_when_every_file_and_link_is_tracked() {
    let t = tempfile::tempdir().unwrap();
    let w = t.path();
    git(w, &["init", "-q"]);
    std::fs::create_dir(w.join("d")).unwrap();
    std::fs::write(w.join("d/a"), b"a").unwrap();
    symlink("d/a", w.join("link")).unwrap();
    git(w, &["add", "-A"]);
    assert!(scan(w, 100, None).unwrap().only_tracked);
    std::fs::create_dir(w.join("empty")).unwrap();
    assert!(
        scan(w, 100, None).unwrap().only_tracked,
        "git has no directories"
    );
    std::fs::write(w.join("d/b"), b"b").unwrap();
    assert!(
        !scan(w, 100, None).unwrap().only_tracked,
        "an untracked file"
    );
    std::fs::remove_file(w.join("d/b")).unwrap();
    rustix::fs::mknodat(
        rustix::fs::CWD,
        w.join("fifo"),
        FileType::Fifo,
        Mode::from_raw_mode(0o600),
        0,
    )
    .unwrap();
    assert!(!scan(w, 100, None).unwrap().only_tracked, "a fifo");
    std::fs::remove_file(w.join("fifo")).unwrap();
    std::fs::write(w.join(".git/index"), b"DIRC garbage").unwrap();
    assert!(
        !scan(w, 100, None).unwrap().only_tracked,
        "an index not read"
    );
}

/// A workspace made from a template, as a create makes it, and its index's checksum.
async fn template_workspace(tmp: &Path) -> (std::path::PathBuf, String) {
    let src = tmp.join("src");
    std::fs::create_dir_all(src.join("d")).unwrap();
    git(&src, &["init", "-q", "-b", "main"]);
    std::fs::write(src.join("a.txt"), b"hello\n").unwrap();
    std::fs::write(src.join("d/b.sh"), b"echo b\n").unwrap();
    std::fs::set_permissions(src.join("d/b.sh"), std::fs::Permissions::from_mode(0o755)).unwrap();
    symlink("a.txt", src.join("link")).unwrap();
    git(&src, &["add", "-A"]);
    git(&src, &["commit", "-q", "-m", "one"]);
    let repo = src.to_str().unwrap();
    let commit = forkyard_common::git_refs::local_commit(repo, "").unwrap();
    let t = template::Templates::open(tmp.join("templates"), 0).unwrap();
    let ws = tmp.join("ws");
    t.workspace(repo, &commit, "fork-1", &ws, Duration::from_secs(60))
        .await
        .unwrap();
    let made = git_index::checksum_of(&ws).unwrap();
    (ws, made)
}

/// What an agent did to a workspace.
type Change = fn(&Path);

/// What an agent may do to a workspace, each tried on a workspace of its own;
/// "d/b.sh" is executable, "link" a link.
fn changes() -> Vec<(&'static str, Change)> {
    vec![
        ("a same-size edit", |w| {
            std::fs::write(w.join("a.txt"), b"HELLO\n").unwrap()
        }),
        ("a deletion", |w| {
            std::fs::remove_file(w.join("a.txt")).unwrap()
        }),
        ("a file replaced by a directory", |w| {
            std::fs::remove_file(w.join("a.txt")).unwrap();
            std::fs::create_dir(w.join("a.txt")).unwrap();
        }),
        ("a mode change", |w| {
            std::fs::set_permissions(w.join("d/b.sh"), std::fs::Permissions::from_mode(0o644))
                .unwrap();
        }),
        ("a link retargeted", |w| {
            std::fs::remove_file(w.join("link")).unwrap();
            symlink("d/b.sh", w.join("link")).unwrap();
        }),
        ("a file made a link", |w| {
            std::fs::remove_file(w.join("a.txt")).unwrap();
            symlink("link", w.join("a.txt")).unwrap();
        }),
        ("an untracked file", |w| {
            std::fs::write(w.join("new"), b"").unwrap()
        }),
        ("an untracked empty directory's file", |w| {
            std::fs::create_dir(w.join("e")).unwrap();
            std::fs::write(w.join("e/x"), b"").unwrap();
        }),
        ("an mtime moved by a nanosecond", |w| {
            let f = std::fs::File::options()
                .write(true)
                .open(w.join("a.txt"))
                .unwrap();
            let m = f.metadata().unwrap().modified().unwrap();
            f.set_modified(m + Duration::from_nanos(1)).unwrap();
        }),
        ("the index rewritten (a chmod staged only)", |w| {
            git(w, &["update-index", "--chmod=+x", "a.txt"]);
        }),
        ("the index older than a file (racily clean to git)", |w| {
            let index = std::fs::File::options()
                .write(true)
                .open(w.join(".git/index"))
                .unwrap();
            index
                .set_modified(SystemTime::UNIX_EPOCH + Duration::from_secs(1))
                .unwrap();
        }),
    ]
}

#[tokio::test]
async fn a_workspace_as_made_is_unchanged_and_any_change_is_seen() {
    let unchanged = |ws: &Path, made: &str| scan(ws, 1 << 20, Some(made)).unwrap().unchanged;
    let changes = changes();
    let tmp = tempfile::tempdir().unwrap();
    let (ws, made) = template_workspace(tmp.path()).await;
    assert!(unchanged(&ws, &made), "a new workspace is as made");
    assert!(
        !scan(&ws, 1 << 20, None).unwrap().unchanged,
        "no index to compare with"
    );
    assert!(!unchanged(&ws, &"0".repeat(40)), "another index");
    assert!(
        !scan(&ws, 1, Some(&made)).unwrap().unchanged,
        "files left out"
    );
    for (i, (what, change)) in changes.iter().enumerate() {
        let tmp = tempfile::tempdir().unwrap();
        let (ws, made) = template_workspace(tmp.path()).await;
        assert!(unchanged(&ws, &made), "{i}: before {what}");
        change(&ws);
        assert!(!unchanged(&ws, &made), "{what}");
    }
}

#[test]
fn pathspecs_exclude_each_left_out_file_literally() {
    let s = Scan {
        too_large: vec![b"a b*".to_vec(), b"dir/x".to_vec()],
        ..Scan::default()
    };
    assert_eq!(
        s.pathspecs(),
        b".\0:(exclude,literal)a b*\0:(exclude,literal)dir/x\0"
    );
    assert_eq!(s.skipped(), ["a b*", "dir/x"]);
}
