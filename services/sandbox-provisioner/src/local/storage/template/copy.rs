//! A template's workspace copied into a new sandbox's, given to the sandbox's uid as it
//! is made.
//!
//! With a uid per sandbox, git's object files are shared, not copied: each is linked
//! (a hard link) into the copy, still owned by the provisioner and read-only. Git never
//! changes an object file; it writes new ones and removes old ones, and a sandbox may
//! remove its links (its directories are its own) but cannot write, `chmod` or `chown`
//! a file of another uid. A create then costs the worktree's files, not the
//! repository's history: a copy of a repository with a 200 MB pack made 200 MB a fork.
//! The host's own writes into a workspace (`files::write_file`) refuse such a file, and
//! giving a workspace to another uid ([`crate::local::isolation::uids::chown_tree`]) leaves it.
//! Without uids (sandboxes run as the provisioner's own uid) every file is copied: a
//! sandbox could `chmod` a shared one and write into every other copy.

use super::settle::preserve_times;
use crate::local::{base::shared::is_shared, isolation::uids};
use std::{
    fs::{self, File},
    io,
    os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt},
    path::Path,
};

/// Copy the directory tree `from` to `to`: files (with their mode), directories, and
/// symlinks as links; files and links keep their mtime (see [`super::settle`]). With
/// `uid`, everything made is given to it at once and git's read-only object files are
/// shared (see the module).
fn copy_tree(from: &Path, to: &Path, uid: Option<u32>) -> io::Result<()> {
    copy_dir(from, to, uid, Part::Worktree)
}

/// A template's workspace `from` copied as a sandbox's workspace `to` ([`copy_tree`]);
/// given to `uid`, readable by it alone.
pub(crate) fn copy_workspace(from: &Path, to: &Path, uid: Option<u32>) -> io::Result<()> {
    copy_tree(from, to, uid)?;
    match uid {
        Some(_) => uids::owner_only(to),
        None => Ok(()),
    }
}

/// Where in a workspace a directory is: only `.git/objects` holds files that are shared.
#[derive(Clone, Copy, PartialEq)]
enum Part {
    Worktree,
    GitDir,
    Objects,
}

fn copy_dir(from: &Path, to: &Path, uid: Option<u32>, part: Part) -> io::Result<()> {
    let mode = fs::symlink_metadata(from)?.permissions().mode();
    fs::DirBuilder::new().mode(mode & 0o7777).create(to)?;
    if let Some(uid) = uid {
        uids::chown(to, uid)?;
    }
    for entry in fs::read_dir(from)? {
        let entry = entry?;
        let (src, dst) = (entry.path(), to.join(entry.file_name()));
        let kind = entry.file_type()?;
        if kind.is_dir() {
            let inner = match (part, entry.file_name().to_str()) {
                (Part::Worktree, Some(".git")) => Part::GitDir,
                (Part::GitDir, Some("objects")) | (Part::Objects, _) => Part::Objects,
                (Part::GitDir, _) => Part::GitDir,
                (Part::Worktree, _) => Part::Worktree,
            };
            copy_dir(&src, &dst, uid, inner)?;
        } else if kind.is_symlink() {
            std::os::unix::fs::symlink(fs::read_link(&src)?, &dst)?;
            if let Some(uid) = uid {
                uids::chown(&dst, uid)?;
            }
            preserve_times(&dst, &entry.metadata()?)?;
        } else if kind.is_file() {
            let meta = entry.metadata()?;
            // Where a link cannot be made (another filesystem: a sandbox with a quota
            // of its own; the file's link count at its limit), a copy serves.
            if part == Part::Objects
                && uid.is_some()
                && shareable(&meta)
                && fs::hard_link(&src, &dst).is_ok()
            {
                continue;
            }
            copy_file(&src, &dst, &meta, uid)?;
        }
    }
    Ok(())
}

/// A file no uid but the provisioner's may change: its own, with no write permission.
fn shareable(meta: &fs::Metadata) -> bool {
    meta.uid() == rustix::process::geteuid().as_raw() && meta.mode() & 0o7222 == 0
}

/// The bytes of the files under `ws/.git/objects` that are shared (see the module).
pub(crate) fn shared_bytes(ws: &Path) -> u64 {
    let mut total = 0;
    let mut dirs = vec![ws.join(".git/objects")];
    while let Some(dir) = dirs.pop() {
        for e in fs::read_dir(&dir).into_iter().flatten().flatten() {
            match e.metadata() {
                Ok(m) if m.is_dir() => dirs.push(e.path()),
                Ok(m) if is_shared(&m) => total += m.blocks() * 512,
                _ => {}
            }
        }
    }
    total
}

/// One file's copy, through its descriptors: made new (never through something at
/// `to`), given to `uid`, with `meta`'s permissions and mtime.
fn copy_file(from: &Path, to: &Path, meta: &fs::Metadata, uid: Option<u32>) -> io::Result<()> {
    let mut src = File::open(from)?;
    let mut dst = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(to)?;
    io::copy(&mut src, &mut dst)?;
    if let Some(uid) = uid {
        uids::give_file(&dst, uid)?;
    }
    // After the chown (which would clear them anyway): no set-id bit on a file of the
    // sandbox's (git checks out 0644 and 0755 only).
    dst.set_permissions(fs::Permissions::from_mode(meta.mode() & 0o1777))?;
    dst.set_modified(meta.modified()?)
}
