//! Walking a tree a sandbox had, by descriptor: what is checked is what is changed.
//!
//! A sandbox's processes may still run while the host changes its workspace (a destroy
//! that goes on after its wait, a hydrate), and a path checked as a directory can be a
//! symlink to anywhere by the time it is used. So every entry is pinned first (`O_PATH`
//! with `O_NOFOLLOW`: a symlink pins the symlink itself), examined and changed through
//! that descriptor, and only a pinned directory is descended into, opened from its own
//! descriptor. No path below the root is ever resolved again.

use rustix::fs::{AtFlags, CWD, Dir, FileType, Mode, OFlags, Stat, fstat, openat};
use std::{
    io,
    os::fd::{AsFd, AsRawFd, OwnedFd},
    path::{Path, PathBuf},
};

/// Deeper trees are refused: one descriptor is open a level, and a hostile sandbox can
/// nest directories far beyond any repository's.
pub(crate) const MAX_DEPTH: usize = 512;

/// One entry of the tree (the root included), pinned.
pub(crate) struct Pinned<'a> {
    /// An `O_PATH` descriptor of the entry itself (never a symlink's target).
    pub fd: &'a OwnedFd,
    pub stat: &'a Stat,
    /// Where the entry is, relative to the root (empty for the root). For naming only:
    /// never resolved again.
    pub rel: &'a Path,
}

impl Pinned<'_> {
    pub fn is_dir(&self) -> bool {
        FileType::from_raw_mode(self.stat.st_mode) == FileType::Directory
    }

    pub fn is_file(&self) -> bool {
        FileType::from_raw_mode(self.stat.st_mode) == FileType::RegularFile
    }

    pub fn is_symlink(&self) -> bool {
        FileType::from_raw_mode(self.stat.st_mode) == FileType::Symlink
    }

    /// The pinned regular file opened for reading, through its descriptor's `/proc` link:
    /// the same inode whatever was renamed or swapped in at its path since. Non-blocking:
    /// an open that would wait for a sandbox process's write lease to be given up fails
    /// at once with `WouldBlock` (each wait is `lease-break-time`, 45 s by default).
    pub fn open_file(&self) -> io::Result<std::fs::File> {
        if !self.is_file() {
            return Err(io::Error::other("not a regular file"));
        }
        let fd = rustix::fs::open(
            self.proc_link().as_str(),
            OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOCTTY | OFlags::NONBLOCK,
            Mode::empty(),
        )?;
        Ok(std::fs::File::from(fd))
    }

    /// The target of the pinned symlink.
    pub fn read_link(&self) -> io::Result<std::ffi::OsString> {
        use std::os::unix::ffi::OsStringExt;
        let target = rustix::fs::readlinkat(self.fd, c"", Vec::new())?;
        Ok(std::ffi::OsString::from_vec(target.into_bytes()))
    }

    /// `chmod` the pinned inode. `fchmod` does not take an `O_PATH` descriptor, and
    /// `fchmodat` cannot refuse a symlink on Linux; the descriptor's `/proc` link
    /// reaches the pinned inode whatever was renamed or swapped in since.
    pub fn chmod(&self, mode: u32) -> io::Result<()> {
        rustix::fs::chmod(self.proc_link().as_str(), Mode::from_raw_mode(mode))?;
        Ok(())
    }

    /// The descriptor's `/proc` link: opened or changed by it, the pinned inode is.
    fn proc_link(&self) -> String {
        format!("/proc/self/fd/{}", self.fd.as_raw_fd())
    }

    /// `chown` the pinned inode (a symlink itself, when it is one).
    pub fn chown(&self, uid: u32) -> io::Result<()> {
        rustix::fs::chownat(
            self.fd,
            c"",
            Some(rustix::fs::Uid::from_raw(uid)),
            Some(rustix::fs::Gid::from_raw(uid)),
            AtFlags::EMPTY_PATH,
        )?;
        Ok(())
    }
}

/// Visit `root` and everything under it, depth first, a directory before its entries.
/// `visit` returns whether to descend into a directory (it may make it readable first).
/// Stops at the first error, a tree deeper than [`MAX_DEPTH`] included.
pub(crate) fn walk(
    root: &Path,
    visit: impl FnMut(&Pinned<'_>) -> io::Result<bool>,
) -> io::Result<()> {
    walk_with(root, visit, |_, skip| {
        Err(match skip {
            Skip::TooDeep => {
                io::Error::other(format!("directory tree deeper than {MAX_DEPTH} levels"))
            }
            Skip::Failed(e) => e,
        })
    })
}

/// Why an entry below the root could not be walked.
#[derive(Debug)]
pub(crate) enum Skip {
    /// A directory at [`MAX_DEPTH`]: what is under it was not visited.
    TooDeep,
    /// It could not be pinned, examined or opened.
    Failed(io::Error),
}

/// [`walk`] where `skip` decides about an entry below the root that cannot be walked
/// (pinned, examined, listed, or deeper than [`MAX_DEPTH`]): `Ok` leaves it (and what is
/// under it) out and goes on, `Err` stops the walk. An error of `visit` always stops it.
pub(crate) fn walk_with(
    root: &Path,
    mut visit: impl FnMut(&Pinned<'_>) -> io::Result<bool>,
    mut skip: impl FnMut(&Path, Skip) -> io::Result<()>,
) -> io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let mut stack: Vec<(Dir, PathBuf)> = Vec::new();
    match enter(pin(CWD, root), Path::new(""), &mut visit)? {
        Entered::Dir(dir) => stack.push((dir, PathBuf::new())),
        Entered::Leaf => {}
        Entered::Unwalkable(e) => return Err(e),
    }
    while let Some((dir, dir_rel)) = stack.last_mut() {
        let entry = match dir.read() {
            None => {
                stack.pop();
                continue;
            }
            Some(Ok(entry)) => entry,
            Some(Err(e)) => {
                let rel = dir_rel.clone();
                stack.pop();
                skip(&rel, Skip::Failed(e.into()))?;
                continue;
            }
        };
        let name = entry.file_name();
        if name == c"." || name == c".." {
            continue;
        }
        let rel = dir_rel.join(std::ffi::OsStr::from_bytes(name.to_bytes()));
        let pinned = dir
            .fd()
            .map_err(io::Error::from)
            .and_then(|fd| pin(fd, name));
        match enter(pinned, &rel, &mut visit)? {
            Entered::Leaf => {}
            Entered::Dir(_) if stack.len() >= MAX_DEPTH => skip(&rel, Skip::TooDeep)?,
            Entered::Dir(sub) => stack.push((sub, rel)),
            // Removed since it was listed: there is nothing left to visit.
            Entered::Unwalkable(e) if e.kind() == io::ErrorKind::NotFound => {}
            Entered::Unwalkable(e) => skip(&rel, Skip::Failed(e))?,
        }
    }
    Ok(())
}

/// What became of one entry.
enum Entered {
    /// Visited, not to be descended into.
    Leaf,
    /// A directory to descend into, opened for reading.
    Dir(Dir),
    /// It could not be pinned, examined or opened (not visited, or not descended into).
    Unwalkable(io::Error),
}

/// Visit one entry, pinned (or not: why). An error of `visit` is this function's.
fn enter(
    pinned: io::Result<OwnedFd>,
    rel: &Path,
    visit: &mut impl FnMut(&Pinned<'_>) -> io::Result<bool>,
) -> io::Result<Entered> {
    let (fd, stat) = match pinned.and_then(|fd| Ok((fstat(&fd)?, fd))) {
        Ok((stat, fd)) => (fd, stat),
        Err(e) => return Ok(Entered::Unwalkable(e)),
    };
    let pinned = Pinned {
        fd: &fd,
        stat: &stat,
        rel,
    };
    if !visit(&pinned)? || !pinned.is_dir() {
        return Ok(Entered::Leaf);
    }
    let readable = openat(
        &fd,
        c".",
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(io::Error::from)
    .and_then(|d| Ok(Dir::new(d)?));
    Ok(readable.map_or_else(Entered::Unwalkable, Entered::Dir))
}

fn pin<P: rustix::path::Arg>(dir: impl AsFd, name: P) -> io::Result<OwnedFd> {
    Ok(openat(
        dir,
        name,
        OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{PermissionsExt, symlink};

    fn mode(p: &Path) -> u32 {
        std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777
    }

    #[test]
    fn a_symlink_is_visited_as_itself_and_never_followed() {
        let tmp = tempfile::tempdir().unwrap();
        let outside = tmp.path().join("outside");
        std::fs::create_dir_all(outside.join("deep")).unwrap();
        let tree = tmp.path().join("tree");
        std::fs::create_dir_all(tree.join("a/b")).unwrap();
        std::fs::write(tree.join("a/b/f"), "x").unwrap();
        symlink(&outside, tree.join("a/link")).unwrap();

        let mut seen = Vec::new();
        walk(&tree, |p| {
            seen.push((p.is_dir(), p.is_file()));
            p.chmod(0o700).ok();
            Ok(true)
        })
        .unwrap();
        // tree, a, b, f and the link itself: nothing of `outside`
        assert_eq!(seen.len(), 5, "{seen:?}");
        assert_eq!(seen.iter().filter(|(d, _)| *d).count(), 3);
        assert_eq!(mode(&outside), 0o755);
        assert_eq!(mode(&outside.join("deep")), 0o755);
        assert_eq!(mode(&tree.join("a/b/f")), 0o700);
    }

    #[test]
    fn a_root_that_is_a_symlink_is_not_walked_into() {
        let tmp = tempfile::tempdir().unwrap();
        let outside = tmp.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("f"), "x").unwrap();
        let root = tmp.path().join("root");
        symlink(&outside, &root).unwrap();
        let mut visited = 0;
        walk(&root, |p| {
            visited += 1;
            assert!(!p.is_dir());
            Ok(true)
        })
        .unwrap();
        assert_eq!(visited, 1);
    }

    #[test]
    fn a_tree_deeper_than_the_bound_is_refused_not_overflowed() {
        let tmp = tempfile::tempdir().unwrap();
        // Built by descriptor: the path would be longer than PATH_MAX.
        let mut fd = rustix::fs::open(tmp.path(), OFlags::DIRECTORY, Mode::empty()).unwrap();
        for _ in 0..MAX_DEPTH + 2 {
            rustix::fs::mkdirat(&fd, "dddddddddd", Mode::from_raw_mode(0o755)).unwrap();
            fd = openat(&fd, "dddddddddd", OFlags::DIRECTORY, Mode::empty()).unwrap();
        }
        let err = walk(tmp.path(), |_| Ok(true)).unwrap_err();
        assert!(err.to_string().contains("deeper than"), "{err}");
    }
}
