//! Indexes git wrote, in every version, read as git lists them; what git would not
//! answer from the files alone, and a damaged index, not read.

use super::*;
use std::{path::Path, process::Command};

impl Index {
    fn paths(&self) -> Vec<Vec<u8>> {
        self.entries.iter().map(|e| e.path.clone()).collect()
    }
}

fn git(dir: &Path, args: &[&str]) -> Vec<u8> {
    let out = Command::new("git")
        .current_dir(dir)
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .args(["-c", "user.name=t", "-c", "user.email=t@t"])
        .args(args)
        .output()
        .unwrap();
    assert!(out.status.success(), "git {args:?}: {out:?}");
    out.stdout
}

/// A repository with files, a link, an executable, long and odd names, committed.
fn repo() -> tempfile::TempDir {
    let t = tempfile::tempdir().unwrap();
    let w = t.path();
    git(w, &["init", "-q"]);
    let long = "l".repeat(250);
    for (p, body) in [
        ("README.md", "hi\n"),
        ("src/a b.txt", "x\n"),
        ("src/é/ü.rs", "y\n"),
        ("src/deep/er/still/file", "z\n"),
        (&format!("src/{long}/{long}")[..], "long\n"),
        ("run.sh", "#!/bin/sh\n"),
    ] {
        let path = w.join(p);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, body).unwrap();
    }
    std::os::unix::fs::symlink("README.md", w.join("link")).unwrap();
    std::fs::set_permissions(
        w.join("run.sh"),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    git(w, &["add", "-A"]);
    git(w, &["commit", "-qm", "one"]);
    t
}

fn ls_files(dir: &Path) -> Vec<Vec<u8>> {
    let mut v: Vec<Vec<u8>> = git(dir, &["ls-files", "-z"])
        .split(|&c| c == 0)
        .filter(|p| !p.is_empty())
        .map(<[u8]>::to_vec)
        .collect();
    v.sort();
    v
}

fn git_dir(dir: &Path) -> OwnedFd {
    rustix::fs::open(
        dir.join(".git"),
        OFlags::RDONLY | OFlags::DIRECTORY,
        Mode::empty(),
    )
    .unwrap()
}

#[test]
fn reads_the_paths_git_lists_in_every_index_version() {
    let t = repo();
    for version in ["2", "3", "4"] {
        git(t.path(), &["update-index", "--index-version", version]);
        let paths = read(&git_dir(t.path())).expect(version).paths();
        assert_eq!(paths, ls_files(t.path()), "index version {version}");
        assert_eq!(paths.len(), 7);
    }
}

#[test]
fn what_git_would_not_answer_from_the_files_alone_is_not_read() {
    let t = repo();
    let w = t.path();
    std::fs::write(w.join("new"), "n\n").unwrap();
    git(w, &["add", "-N", "new"]);
    assert_eq!(read(&git_dir(w)), None, "intent to add");
    git(w, &["rm", "-q", "--cached", "new"]);
    assert!(read(&git_dir(w)).is_some());
    git(w, &["update-index", "--skip-worktree", "README.md"]);
    assert_eq!(read(&git_dir(w)), None, "skip-worktree");
    git(w, &["update-index", "--no-skip-worktree", "README.md"]);
    git(w, &["update-index", "--assume-unchanged", "README.md"]);
    assert_eq!(read(&git_dir(w)), None, "assume-unchanged");
    git(w, &["update-index", "--no-assume-unchanged", "README.md"]);
    git(w, &["config", "core.splitIndex", "true"]);
    assert_eq!(read(&git_dir(w)), None, "split index");
}

#[test]
fn an_unmerged_index_is_not_read() {
    let t = repo();
    let w = t.path();
    git(w, &["checkout", "-qb", "other"]);
    std::fs::write(w.join("README.md"), "other\n").unwrap();
    git(w, &["commit", "-qam", "other"]);
    git(w, &["checkout", "-q", "-"]);
    std::fs::write(w.join("README.md"), "mine\n").unwrap();
    git(w, &["commit", "-qam", "mine"]);
    let merge = Command::new("git")
        .current_dir(w)
        .args([
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@t",
            "merge",
            "-q",
            "other",
        ])
        .output()
        .unwrap();
    assert!(!merge.status.success(), "a conflict was wanted");
    assert_eq!(read(&git_dir(w)), None);
}

#[test]
fn another_object_format_is_not_read() {
    let t = tempfile::tempdir().unwrap();
    git(t.path(), &["init", "-q", "--object-format=sha256"]);
    std::fs::write(t.path().join("a"), "a\n").unwrap();
    git(t.path(), &["add", "a"]);
    assert_eq!(read(&git_dir(t.path())), None);
}

#[test]
fn keys_decide_not_values() {
    assert!(plain_config(
        b"[core]\n\tbare = false\n[remote \"origin\"]\n\turl = /srv/sparse-worktree.git\n"
    ));
    assert!(!plain_config(b"[core]\n\tworktree = /elsewhere\n"));
    assert!(!plain_config(b"[core] worktree = /elsewhere\n"));
    assert!(plain_config(b"[core] bare = false\n"));
    assert!(!plain_config(b"[extensions]\n\tobjectFormat = sha256\n"));
    assert!(!plain_config(b"[index]\n\tsparse = true\n"));
    assert!(!plain_config(b"[include]\n\tpath = other\n"));
    assert!(!plain_config(b"[includeIf \"gitdir:/\"]\n\tpath = other\n"));
}

#[test]
fn a_cut_or_damaged_index_is_refused_or_read_without_a_panic() {
    let t = repo();
    for version in ["2", "4"] {
        git(t.path(), &["update-index", "--index-version", version]);
        let whole = std::fs::read(t.path().join(".git/index")).unwrap();
        assert!(parse(&whole).is_some());
        for cut in 0..whole.len() {
            assert_eq!(parse(&whole[..cut]), None, "cut at {cut}");
        }
        // Every single byte changed: any answer, never a panic or a runaway allocation.
        let mut bad = whole.clone();
        for i in 0..whole.len() {
            for flip in [0x01, 0x80, 0xff] {
                bad[i] ^= flip;
                let _ = parse(&bad);
                bad[i] ^= flip;
            }
        }
    }
}

#[test]
fn an_index_that_is_not_a_file_is_not_read() {
    let t = repo();
    let index = t.path().join(".git/index");
    std::fs::rename(&index, t.path().join(".git/real-index")).unwrap();
    std::os::unix::fs::symlink("real-index", &index).unwrap();
    assert_eq!(read(&git_dir(t.path())), None);
}

/// A version 4 index whose first path is `first` bytes long and whose every later path
/// repeats the one before it but the last `strip` bytes, and adds `add`.
fn growing_v4(entries: usize, first: usize, strip: u8, add: usize) -> Vec<u8> {
    use sha1::Digest;
    let mut b = b"DIRC".to_vec();
    b.extend_from_slice(&4u32.to_be_bytes());
    b.extend_from_slice(&(entries as u32).to_be_bytes());
    for i in 0..entries {
        let mut stat = [0u8; STAT];
        stat[24..28].copy_from_slice(&0o100644u32.to_be_bytes());
        b.extend_from_slice(&stat);
        b.extend_from_slice(&[0u8; HASH]);
        b.extend_from_slice(&0u16.to_be_bytes());
        let (strip, add) = if i == 0 { (0, first) } else { (strip, add) };
        b.push(strip);
        b.extend(std::iter::repeat_n(b'a' + (i % 20) as u8, add));
        b.push(0);
    }
    let sum = sha1::Sha1::digest(&b);
    b.extend_from_slice(&sum);
    b
}

#[test]
fn a_small_index_cannot_expand_to_huge_paths() {
    // 64 bytes more each time: a 1 MiB index would expand to about 2 GB of paths.
    assert_eq!(
        parse(&growing_v4(10, 1, 0, 64)).map(|p| p.entries.len()),
        Some(10)
    );
    assert_eq!(parse(&growing_v4(12_000, 1, 0, 64)), None);
    // Paths of 4,000 bytes from 67 bytes of index each: 10,000 of them would be 40 MB.
    assert_eq!(
        parse(&growing_v4(100, 4000, 1, 1)).map(|p| p.entries.len()),
        Some(100)
    );
    assert_eq!(parse(&growing_v4(10_000, 4000, 1, 1)), None);
}
