//! What the provisioner reads of a workspace before its patch is collected, on the
//! host: a stale index lock to clear, the files too large to stage, whether any
//! file is untracked (when none is, one `git diff` of the worktree is the patch and no
//! `git add` is needed), and whether nothing changed at all (then there is no patch and
//! no git to run: see [`Scan::unchanged`]). Done here
//! rather than by a shell and `find` in the sandbox: two process starts a fork saved
//! (each a millisecond or more of CPU), for a walk of metadata only.
//!
//! The workspace is the agent's: anything in it can be a symlink, and can change while
//! it is read. Every directory is opened relative to its parent's descriptor, with
//! `O_NOFOLLOW`, and every file is looked at with `AT_SYMLINK_NOFOLLOW`: the walk never
//! leaves the workspace and never opens anything but directories. A race can only
//! change which paths are named (what git then stages, inside the sandbox).

use crate::local::storage::repo::git_index;
use rustix::fs::{AtFlags, Dir, FileType, Mode, OFlags};
use std::{
    os::fd::OwnedFd,
    path::Path,
    time::{Duration, SystemTime},
};

/// An index lock at least this old is left by a collection cut off mid-way (its caller
/// died) and is removed; a younger one may be a running git's.
const STALE_LOCK: Duration = Duration::from_secs(5);
/// Deeper trees are left to the in-sandbox script, as are unusual `.git` entries.
const MAX_DEPTH: usize = 64;

/// What the walk found: the files larger than the limit (paths relative to the
/// workspace, as the file system spells them), and whether every file and link of the
/// worktree is in the git index (read by [`git_index`]: false when it could not be).
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Scan {
    pub(crate) too_large: Vec<Vec<u8>>,
    pub(crate) only_tracked: bool,
    /// The workspace is as it was made, by the checks git itself makes before it looks
    /// at a file's content: its index is byte for byte the one the workspace was made
    /// with (a checkout of the base commit), every tracked path is there, every file and
    /// link is tracked, and each has the mode, size and mtime (to the nanosecond) the
    /// index holds for it, older than the index itself (so git would not re-read it as
    /// racily clean). `git diff <base>` would print nothing: the patch is empty.
    pub(crate) unchanged: bool,
}

impl Scan {
    /// The pathspecs `git add --pathspec-from-file=- --pathspec-file-nul` reads: the
    /// whole tree but the files left out.
    pub(crate) fn pathspecs(&self) -> Vec<u8> {
        let mut out = b".\0".to_vec();
        for path in &self.too_large {
            out.extend_from_slice(b":(exclude,literal)");
            out.extend_from_slice(path);
            out.push(0);
        }
        out
    }

    /// The left-out paths as the response names them.
    pub(crate) fn skipped(&self) -> Vec<String> {
        self.too_large
            .iter()
            .map(|p| String::from_utf8_lossy(p).into_owned())
            .collect()
    }
}

/// Clear a stale index lock and list the files larger than `max_bytes`. `None` when the
/// workspace is not the usual shape (its `.git` not a plain directory, a tree deeper
/// than [`MAX_DEPTH`], a directory that cannot be read): the caller then lets the
/// in-sandbox script do it all. `made_with`: the checksum of the index the workspace
/// was made with, when that index is a checkout of the base commit.
pub(crate) fn scan(workspace: &Path, max_bytes: u64, made_with: Option<&str>) -> Option<Scan> {
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
    let root = rustix::fs::open(workspace, flags | OFlags::NOFOLLOW, Mode::empty()).ok()?;
    let git = rustix::fs::statat(&root, ".git", AtFlags::SYMLINK_NOFOLLOW).ok()?;
    if FileType::from_raw_mode(git.st_mode) != FileType::Directory {
        return None;
    }
    let git = subdir(&root, b".git")?;
    clear_stale_lock(&git);
    let index = git_index::read(&git);
    let as_made = index
        .as_ref()
        .is_some_and(|i| made_with.is_some_and(|m| m == git_index::hex(&i.checksum)));
    let mut scan = Scan {
        only_tracked: index.is_some(),
        unchanged: as_made,
        ..Scan::default()
    };
    let mut walk = Walk {
        max: max_bytes,
        index: index.as_ref(),
        seen: vec![false; index.as_ref().map_or(0, |i| i.entries.len())],
        scan: &mut scan,
    };
    if !walk.dir(root, &mut Vec::new(), 0) {
        return None;
    }
    // A tracked path the walk never met was deleted (or replaced by a directory). Marked,
    // not counted: a directory read while something renames in it may name a file twice.
    let all_there = index.is_some() && walk.seen.iter().all(|&s| s);
    scan.unchanged &= all_there && scan.only_tracked && scan.too_large.is_empty();
    Some(scan)
}

/// A directory entry opened as a directory, never through a symlink.
fn subdir(parent: &OwnedFd, name: &[u8]) -> Option<OwnedFd> {
    let flags =
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC;
    rustix::fs::openat(parent, name, flags, Mode::empty()).ok()
}

fn clear_stale_lock(git: &OwnedFd) {
    let Ok(lock) = rustix::fs::statat(git, "index.lock", AtFlags::SYMLINK_NOFOLLOW) else {
        return;
    };
    // Whole seconds are enough to tell an age of seconds.
    let mtime =
        SystemTime::UNIX_EPOCH + Duration::from_secs(u64::try_from(lock.st_mtime).unwrap_or(0));
    let old = SystemTime::now()
        .duration_since(mtime)
        .is_ok_and(|age| age >= STALE_LOCK);
    // unlinkat never follows the name it removes, and refuses a directory.
    if old && let Err(e) = rustix::fs::unlinkat(git, "index.lock", AtFlags::empty()) {
        tracing::debug!(error = %e, "cannot remove a stale index lock");
    }
}

struct Walk<'a> {
    max: u64,
    /// The workspace's index, if read.
    index: Option<&'a git_index::Index>,
    /// Which of the index's entries the walk met as a file or link.
    seen: Vec<bool>,
    scan: &'a mut Scan,
}

impl Walk<'_> {
    /// Walk `dir` (at `prefix` in the workspace), adding its too-large files to the
    /// scan and noting an untracked one. False when the walk gave up (too deep,
    /// unreadable).
    fn dir(&mut self, dir: OwnedFd, prefix: &mut Vec<u8>, depth: usize) -> bool {
        if depth > MAX_DEPTH {
            return false;
        }
        let Ok(mut entries) = Dir::read_from(&dir) else {
            return false;
        };
        while let Some(entry) = entries.read() {
            let Ok(entry) = entry else {
                return false;
            };
            let name = entry.file_name().to_bytes();
            if name == b"." || name == b".." || (depth == 0 && name == b".git") {
                continue;
            }
            let kind = match entry.file_type() {
                FileType::Unknown => {
                    match rustix::fs::statat(&dir, name, AtFlags::SYMLINK_NOFOLLOW) {
                        Ok(st) => FileType::from_raw_mode(st.st_mode),
                        // Gone meanwhile: nothing to leave out.
                        Err(_) => continue,
                    }
                }
                kind => kind,
            };
            let len = prefix.len();
            if !prefix.is_empty() {
                prefix.push(b'/');
            }
            prefix.extend_from_slice(name);
            let ok = match kind {
                // Replaced by something else meanwhile: not a directory of this tree.
                FileType::Directory => match subdir(&dir, name) {
                    Some(sub) => self.dir(sub, prefix, depth + 1),
                    None => true,
                },
                kind => {
                    self.file(&dir, name, kind, prefix);
                    true
                }
            };
            prefix.truncate(len);
            if !ok {
                return false;
            }
        }
        true
    }

    /// A file, link or special file `name` of `dir`, at `path` in the workspace.
    fn file(&mut self, dir: &OwnedFd, name: &[u8], kind: FileType, path: &[u8]) {
        // git tracks files and links only: anything else is news to the index.
        if !matches!(kind, FileType::RegularFile | FileType::Symlink) {
            self.scan.only_tracked = false;
            return;
        }
        let st = rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW).ok();
        if kind == FileType::RegularFile
            && st.as_ref().is_some_and(|st| {
                FileType::from_raw_mode(st.st_mode) == FileType::RegularFile
                    && u64::try_from(st.st_size).unwrap_or(0) > self.max
            })
        {
            self.scan.too_large.push(path.to_vec());
        }
        let Some(index) = self.index else { return };
        let Some(at) = index.find(path) else {
            self.scan.only_tracked = false;
            return;
        };
        self.seen[at] = true;
        let entry = &index.entries[at];
        self.scan.unchanged &= st.is_some_and(|st| as_recorded(&st, entry, index.mtime));
    }
}

/// Whether git, comparing what it recorded of the file with `st` (with `core.checkStat=
/// minimal` or stricter), would take the file as unchanged without reading it. Stricter
/// than git where that is cheaper than being exact: nanoseconds are compared too, and a
/// file from the index's own second or later counts as changed (git would read it).
fn as_recorded(st: &rustix::fs::Stat, entry: &git_index::Entry, index_mtime: i64) -> bool {
    let mode = match FileType::from_raw_mode(st.st_mode) {
        FileType::RegularFile if st.st_mode & 0o100 != 0 => 0o100_755,
        FileType::RegularFile => 0o100_644,
        FileType::Symlink => 0o120_000,
        _ => return false,
    };
    // git keeps the low 32 bits of each.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let (sec, nsec, size) = (
        st.st_mtime as u32,
        st.st_mtime_nsec as u32,
        st.st_size as u32,
    );
    mode == entry.mode
        && (sec, nsec) == entry.mtime
        && size == entry.size
        && i64::from(entry.mtime.0) < index_mtime
}

#[cfg(test)]
#[path = "patch_scan_tests.rs"]
mod tests;
