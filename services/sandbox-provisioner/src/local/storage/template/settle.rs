//! A template's worktree whose stat data git can trust in every copy of it.
//!
//! A workspace is a file copy of its template, so every file has a new inode and ctime;
//! with git's default checks each copy's first `git add` (patch collection) would hash
//! the whole repository again and rewrite the index: 0.8 s a fork for a repository of
//! 10,000 files. Instead each of the template's files gets a whole-second mtime of its
//! own in the past (two seconds ago, three, four, ...), the template's index records
//! them, copies keep them ([`preserve_times`]), and git in the sandbox checks only what
//! a copy keeps (`core.checkStat=minimal`, no ctime: [`crate::git::sandbox_env`]).
//! Whatever an agent writes later has a newer mtime than every template file, and the
//! index is newer than all of them, so no entry is racily clean. And no two template
//! files share an mtime, so one moved or copied (`mv`, `cp -p`) over another of the
//! same size still differs from its entry.

use std::{
    io,
    path::Path,
    time::{Duration, SystemTime},
};

/// Give every file and symlink of the worktree at `ws` (its `.git`s aside) a whole-second
/// mtime of its own: two seconds ago for the first, one second less for each next.
pub(crate) fn worktree(ws: &Path) -> io::Result<()> {
    let ago = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
        .saturating_sub(Duration::from_secs(2));
    let mut next = i64::try_from(ago.as_secs()).unwrap_or(i64::MAX);
    walk(ws, &mut next)
}

fn walk(dir: &Path, next: &mut i64) -> io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let kind = entry.file_type()?;
        // The workspace's repository, and a submodule's below it (git tracks no path
        // named `.git`, so one deeper is a nested repository's): not worktree files.
        if entry.file_name() == ".git" {
            continue;
        }
        if kind.is_dir() {
            walk(&entry.path(), next)?;
        } else {
            let at = rustix::fs::Timespec {
                tv_sec: *next,
                tv_nsec: 0,
            };
            set_mtime(&entry.path(), at)?;
            *next -= 1;
        }
    }
    Ok(())
}

/// Give `dst` (a file or a symlink, not followed) the mtime `src_meta` holds.
pub(crate) fn preserve_times(dst: &Path, src_meta: &std::fs::Metadata) -> io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let at = rustix::fs::Timespec {
        tv_sec: src_meta.mtime(),
        tv_nsec: src_meta.mtime_nsec() as _,
    };
    set_mtime(dst, at)
}

fn set_mtime(path: &Path, at: rustix::fs::Timespec) -> io::Result<()> {
    let times = rustix::fs::Timestamps {
        last_access: rustix::fs::Timespec {
            tv_sec: 0,
            tv_nsec: rustix::fs::UTIME_OMIT,
        },
        last_modification: at,
    };
    rustix::fs::utimensat(
        rustix::fs::CWD,
        path,
        &times,
        rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
    )?;
    Ok(())
}
