//! Changes to a tree beneath its root, by descriptor: every path component is opened
//! from its parent's descriptor with `O_NOFOLLOW`, so a symbolic link on the way (one
//! that a lower layer put there, say) is never followed out. An entry whose path runs
//! through a link or a file is refused ([`ConfineError::ThroughLink`]); a link that is
//! the last component is changed itself, never what it names. Nothing below the root is
//! resolved by path, so what is changed is confined by construction, not by checks.
//!
//! Used for what an image's layers and archives write into the cache
//! (`crate::local::storage::image`, inside its unpack thread's jail) and for the snapshots a
//! sandbox's workspace is restored from (`crate::local::storage::snapshot`): both are archives
//! someone else made.

use crate::local::base::fd_walk;
use fs::{clear, copy_sparse, gid, mkdir, remove_at, set_meta, times, uid};
use rustix::{
    fs::{AtFlags, FileType, Mode, OFlags},
    io::Errno,
};
use std::{
    collections::BTreeMap,
    ffi::OsStr,
    io::{self, Read},
    os::fd::{AsFd, OwnedFd},
    path::{Component, Path, PathBuf},
};

/// Deeper paths are refused: a tree built from a hostile archive must stay walkable
/// (one descriptor is open a level when it is removed).
pub const MAX_DEPTH: usize = fd_walk::MAX_DEPTH;

/// Why a change was not made.
#[derive(Debug, thiserror::Error)]
pub enum ConfineError {
    /// A component of the path is a symbolic link or not a directory.
    #[error("{} runs through a symbolic link or a file", .0.display())]
    ThroughLink(PathBuf),
    /// The path is not a plain relative one (`..`, absolute), or too deep.
    #[error("{path}: {why}", path = .0.display(), why = .1)]
    BadPath(PathBuf, &'static str),
    #[error("{path}: {why}", path = .0.display(), why = .1)]
    Io(PathBuf, io::Error),
}

/// A tree being written, from the descriptor of its root.
pub struct Tree {
    root: OwnedFd,
    /// Set owners from the archive (only root can).
    owners: bool,
    /// The last directory looked up, by its path: a tar lists a directory's entries
    /// together, so most lookups are this one.
    last: Option<(PathBuf, OwnedFd)>,
    /// Directories whose mode, owner and time are set at [`Tree::finish`]: set early, a
    /// read-only directory would refuse its own entries, and each entry written into a
    /// directory changes its time.
    dirs: BTreeMap<PathBuf, Meta>,
}

impl Tree {
    /// The tree under `root` (a directory, not a link).
    pub fn open(root: &Path, owners: bool) -> io::Result<Self> {
        let root = rustix::fs::open(
            root,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        Ok(Self {
            root,
            owners,
            last: None,
            dirs: BTreeMap::new(),
        })
    }

    /// The directory `rel` beneath the root; its missing components made (0755) when
    /// `create`, else `None` when one is missing.
    fn dir(&mut self, rel: &Path, create: bool) -> Result<Option<&OwnedFd>, ConfineError> {
        if self.last.as_ref().is_none_or(|(p, _)| p != rel) {
            self.last = None;
            let Some(fd) = walk(&self.root, rel, create)? else {
                return Ok(None);
            };
            self.last = Some((rel.to_path_buf(), fd));
        }
        Ok(self.last.as_ref().map(|(_, fd)| fd))
    }

    /// The parent directory of `rel` (made where missing) and `rel`'s last name.
    fn parent<'a>(&mut self, rel: &'a Path) -> Result<(&OwnedFd, &'a OsStr), ConfineError> {
        let (parent, name) = split(rel)?;
        let fd = self.dir(parent, true)?.expect("made where missing");
        Ok((fd, name))
    }

    /// Remove `rel` (a whole directory, or a link itself); missing is fine, and so is a
    /// parent that is missing.
    pub fn remove(&mut self, rel: &Path) -> Result<(), ConfineError> {
        let (parent, name) = split(rel)?;
        let Some(dir) = self.dir(parent, false)? else {
            return Ok(());
        };
        remove_at(dir, name, 0).map_err(|e| ConfineError::Io(rel.to_path_buf(), e))?;
        self.forget(rel);
        Ok(())
    }

    /// Empty the directory `rel` of everything in it (an opaque whiteout).
    pub fn clear(&mut self, rel: &Path) -> Result<(), ConfineError> {
        let Some(dir) = self.dir(rel, false)? else {
            return Ok(());
        };
        let readable = rustix::fs::openat(
            dir,
            c".",
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        );
        readable
            .map_err(io::Error::from)
            .and_then(|d| clear(&d, 0))
            .map_err(|e| ConfineError::Io(rel.to_path_buf(), e))?;
        let under: Vec<PathBuf> = self
            .dirs
            .keys()
            .filter(|p| p.starts_with(rel) && p.as_path() != rel)
            .cloned()
            .collect();
        for p in under {
            self.dirs.remove(&p);
        }
        Ok(())
    }

    /// A regular file at `rel` with `data` (whatever was there replaced); the bytes
    /// written.
    pub fn file(
        &mut self,
        rel: &Path,
        data: &mut dyn Read,
        meta: Meta,
    ) -> Result<u64, ConfineError> {
        let owners = self.owners;
        let at = |e: io::Error| ConfineError::Io(rel.to_path_buf(), e);
        let (dir, name) = self.parent(rel)?;
        remove_at(dir, name, 0).map_err(at)?;
        let fd = rustix::fs::openat(
            dir,
            name,
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
        )
        .map_err(|e| at(e.into()))?;
        let mut file = std::fs::File::from(fd);
        let written = copy_sparse(data, &mut file).map_err(at)?;
        set_meta(file.as_fd(), meta, owners).map_err(at)?;
        self.forget(rel);
        Ok(written)
    }

    /// A directory at `rel`: one already there is kept (and takes `meta`), anything else
    /// replaced.
    pub fn mkdir(&mut self, rel: &Path, meta: Meta) -> Result<(), ConfineError> {
        let at = |e: io::Error| ConfineError::Io(rel.to_path_buf(), e);
        let (dir, name) = self.parent(rel)?;
        match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) if FileType::from_raw_mode(st.st_mode) == FileType::Directory => {}
            Ok(_) => {
                remove_at(dir, name, 0).map_err(at)?;
                mkdir(dir, name).map_err(at)?;
            }
            Err(Errno::NOENT) => mkdir(dir, name).map_err(at)?,
            Err(e) => return Err(at(e.into())),
        }
        self.dirs.insert(rel.to_path_buf(), meta);
        Ok(())
    }

    /// A symbolic link at `rel` to `target` (never followed here: its text is the
    /// sandbox's business).
    pub fn symlink(&mut self, rel: &Path, target: &Path, meta: Meta) -> Result<(), ConfineError> {
        let owners = self.owners;
        let at = |e: io::Error| ConfineError::Io(rel.to_path_buf(), e);
        let (dir, name) = self.parent(rel)?;
        remove_at(dir, name, 0).map_err(at)?;
        rustix::fs::symlinkat(target, dir, name).map_err(|e| at(e.into()))?;
        if owners {
            rustix::fs::chownat(
                dir,
                name,
                uid(meta.uid),
                gid(meta.gid),
                AtFlags::SYMLINK_NOFOLLOW,
            )
            .map_err(|e| at(e.into()))?;
        }
        rustix::fs::utimensat(dir, name, &times(meta.mtime), AtFlags::SYMLINK_NOFOLLOW)
            .map_err(|e| at(e.into()))?;
        self.forget(rel);
        Ok(())
    }

    /// A hard link at `rel` to the entry at `target`, both beneath the root (a link
    /// that is the target is linked itself). A target that is missing is refused.
    pub fn hardlink(&mut self, rel: &Path, target: &Path) -> Result<(), ConfineError> {
        let (tparent, tname) = split(target)?;
        let Some(tdir) = walk(&self.root, tparent, false)? else {
            return Err(ConfineError::BadPath(
                target.to_path_buf(),
                "no such entry to link to",
            ));
        };
        let at = |e: io::Error| ConfineError::Io(rel.to_path_buf(), e);
        let (dir, name) = self.parent(rel)?;
        if (tparent, tname) == split(rel)? {
            return Ok(());
        }
        remove_at(dir, name, 0).map_err(at)?;
        rustix::fs::linkat(&tdir, tname, dir, name, AtFlags::empty()).map_err(|e| at(e.into()))?;
        self.forget(rel);
        Ok(())
    }

    /// One entry of a tar: files, directories, symbolic and hard links (a hard link's
    /// target beneath the root too); device nodes, fifos and types no tree here needs
    /// are skipped. Numeric fields some archivers leave blank (a link's mode) take
    /// defaults.
    pub fn entry<R: Read>(&mut self, entry: &mut tar::Entry<'_, R>) -> Result<(), ConfineError> {
        let raw = entry
            .path()
            .map_err(|e| ConfineError::Io(PathBuf::new(), e))?;
        let path = plain(&raw)?;
        if path.as_os_str().is_empty() {
            return Ok(());
        }
        let h = entry.header();
        let kind = h.entry_type();
        let meta = Meta {
            mode: h
                .mode()
                .unwrap_or(if kind.is_dir() { 0o755 } else { 0o644 }),
            uid: h
                .uid()
                .ok()
                .and_then(|u| u32::try_from(u).ok())
                .unwrap_or(0),
            gid: h
                .gid()
                .ok()
                .and_then(|g| u32::try_from(g).ok())
                .unwrap_or(0),
            mtime: h
                .mtime()
                .ok()
                .and_then(|t| i64::try_from(t).ok())
                .unwrap_or(0),
        };
        let link = || -> Result<PathBuf, ConfineError> {
            let named = entry
                .link_name()
                .map_err(|e| ConfineError::Io(path.clone(), e))?;
            named
                .map(std::borrow::Cow::into_owned)
                .ok_or(ConfineError::BadPath(
                    path.clone(),
                    "a link that names no target",
                ))
        };
        if kind.is_dir() {
            self.mkdir(&path, meta)
        } else if kind.is_symlink() {
            let target = link()?;
            self.symlink(&path, &target, meta)
        } else if kind.is_hard_link() {
            let target = plain(&link()?)?;
            self.hardlink(&path, &target)
        } else if kind.is_file() || kind.is_contiguous() || kind.is_gnu_sparse() {
            self.file(&path, entry, meta).map(|_| ())
        } else {
            Ok(())
        }
    }

    /// Set the directories' modes, owners and times, deepest first (a directory
    /// closed to its owner would keep the unpacker out of the ones below it).
    pub fn finish(mut self) -> Result<(), ConfineError> {
        let mut dirs: Vec<_> = std::mem::take(&mut self.dirs).into_iter().collect();
        dirs.sort_by_key(|(p, _)| std::cmp::Reverse(p.components().count()));
        for (rel, meta) in dirs {
            let at = |e: io::Error| ConfineError::Io(rel.clone(), e);
            let (parent, name) = split(&rel)?;
            let Some(pdir) = walk(&self.root, parent, false)? else {
                continue;
            };
            let fd = match rustix::fs::openat(
                &pdir,
                name,
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            ) {
                Ok(fd) => fd,
                // Replaced or removed by a later entry of the same layer.
                Err(Errno::NOENT | Errno::NOTDIR | Errno::LOOP) => continue,
                Err(e) => return Err(at(e.into())),
            };
            set_meta(fd.as_fd(), meta, self.owners).map_err(at)?;
        }
        Ok(())
    }

    /// `rel` and what was under it no longer wait for [`Tree::finish`].
    fn forget(&mut self, rel: &Path) {
        if self.dirs.remove(rel).is_some() {
            self.dirs.retain(|p, _| !p.starts_with(rel));
        }
        if self.last.as_ref().is_some_and(|(p, _)| p.starts_with(rel)) {
            self.last = None;
        }
    }
}

/// Open the directory `rel` beneath `root` one component at a time, never following a
/// link; make what is missing when `create`, else `None`.
fn walk(root: &OwnedFd, rel: &Path, create: bool) -> Result<Option<OwnedFd>, ConfineError> {
    let mut cur = rustix::fs::openat(
        root,
        c".",
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| ConfineError::Io(PathBuf::new(), e.into()))?;
    let mut so_far = PathBuf::new();
    for c in rel.components() {
        let Component::Normal(name) = c else {
            return Err(ConfineError::BadPath(
                rel.to_path_buf(),
                "not a plain relative path",
            ));
        };
        so_far.push(name);
        let open = |dir: &OwnedFd| {
            rustix::fs::openat(
                dir,
                name,
                OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            )
        };
        let next = match open(&cur) {
            Err(Errno::NOENT) if create => {
                mkdir(&cur, name).map_err(|e| ConfineError::Io(so_far.clone(), e))?;
                open(&cur)
            }
            Err(Errno::NOENT) => return Ok(None),
            other => other,
        };
        cur = match next {
            Ok(fd) => fd,
            Err(Errno::LOOP | Errno::NOTDIR) => return Err(ConfineError::ThroughLink(so_far)),
            Err(e) => return Err(ConfineError::Io(so_far, e.into())),
        };
    }
    Ok(Some(cur))
}

/// An archive's path made plain (`./usr/bin`, `/usr/bin` → `usr/bin`); one that climbs
/// (`..`) is refused.
pub fn plain(path: &Path) -> Result<PathBuf, ConfineError> {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::Normal(n) => out.push(n),
            Component::CurDir | Component::RootDir => {}
            Component::ParentDir | Component::Prefix(_) => {
                return Err(ConfineError::BadPath(path.to_path_buf(), "climbs out"));
            }
        }
    }
    Ok(out)
}

/// `rel`'s parent and last name; `rel` must be plain, relative, not empty and within
/// [`MAX_DEPTH`].
fn split(rel: &Path) -> Result<(&Path, &OsStr), ConfineError> {
    let bad = |why| ConfineError::BadPath(rel.to_path_buf(), why);
    let mut n = 0;
    for c in rel.components() {
        if !matches!(c, Component::Normal(_)) {
            return Err(bad("not a plain relative path"));
        }
        n += 1;
    }
    if n > MAX_DEPTH {
        return Err(bad("deeper than any image needs"));
    }
    match (rel.parent(), rel.file_name()) {
        (Some(p), Some(name)) => Ok((p, name)),
        _ => Err(bad("an empty path")),
    }
}

/// Open `rel` beneath `dir` for reading, its links resolved as if `dir` were the root
/// (`openat2` with `RESOLVE_IN_ROOT`): an archive's own links (a `docker save` layer
/// that is a link to another's) work, and none leads out of it.
pub fn open_in_root(dir: &Path, rel: &str) -> io::Result<std::fs::File> {
    let root = rustix::fs::open(
        dir,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let fd = rustix::fs::openat2(
        &root,
        rel,
        OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOCTTY,
        Mode::empty(),
        rustix::fs::ResolveFlags::IN_ROOT
            | rustix::fs::ResolveFlags::NO_MAGICLINKS
            | rustix::fs::ResolveFlags::NO_XDEV,
    )?;
    let file = std::fs::File::from(fd);
    if !file.metadata()?.is_file() {
        return Err(io::Error::other("not a regular file"));
    }
    Ok(file)
}

#[path = "confined_fs.rs"]
mod fs;
pub use fs::Meta;
#[cfg(test)]
#[path = "confined_tests.rs"]
mod tests;
