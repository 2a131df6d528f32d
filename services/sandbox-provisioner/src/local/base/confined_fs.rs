//! The leaves of [`super`]'s writes: one call each, on a descriptor already confined
//! (a directory opened beneath the root), never a path resolved from the root.

use crate::local::base::fd_walk::MAX_DEPTH;
use rustix::{
    fs::{AtFlags, Dir, Mode, OFlags, Timespec, Timestamps},
    io::Errno,
};
use std::{
    ffi::{OsStr, OsString},
    io::{self, Read},
    os::fd::OwnedFd,
};

pub(super) fn mkdir(dir: &OwnedFd, name: &OsStr) -> io::Result<()> {
    match rustix::fs::mkdirat(dir, name, Mode::from_raw_mode(0o755)) {
        Ok(()) | Err(Errno::EXIST) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Remove the entry `name` of `dir` (a directory with all it holds; a link itself).
pub(super) fn remove_at(dir: &OwnedFd, name: &OsStr, depth: usize) -> io::Result<()> {
    match rustix::fs::unlinkat(dir, name, AtFlags::empty()) {
        Ok(()) | Err(Errno::NOENT) => return Ok(()),
        Err(Errno::ISDIR | Errno::PERM) => {}
        Err(e) => return Err(e.into()),
    }
    if depth > MAX_DEPTH {
        return Err(io::Error::other(format!(
            "a directory tree deeper than {MAX_DEPTH} levels"
        )));
    }
    let sub = rustix::fs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    clear(&sub, depth + 1)?;
    match rustix::fs::unlinkat(dir, name, AtFlags::REMOVEDIR) {
        Ok(()) | Err(Errno::NOENT) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Remove everything in the directory `dir` (opened for reading).
pub(super) fn clear(dir: &OwnedFd, depth: usize) -> io::Result<()> {
    use std::os::unix::ffi::OsStrExt as _;
    let mut names: Vec<OsString> = Vec::new();
    for entry in Dir::read_from(dir)? {
        let entry = entry?;
        let name = entry.file_name().to_bytes();
        if name != b"." && name != b".." {
            names.push(OsStr::from_bytes(name).to_owned());
        }
    }
    names.iter().try_for_each(|n| remove_at(dir, n, depth))
}

/// Copy `data` into `file`, leaving holes where whole blocks are zero: a sparse file
/// that an archive holds as its zeros (a terabyte `truncate` in a snapshot, an image's
/// sparse database) takes no disk where it had none. The bytes copied.
pub(super) fn copy_sparse(data: &mut dyn Read, file: &mut std::fs::File) -> io::Result<u64> {
    use std::io::{Seek as _, SeekFrom, Write as _};
    const BLOCK: usize = 64 << 10;
    let mut buf = vec![0u8; BLOCK];
    let mut total = 0u64;
    let mut hole = false;
    loop {
        let mut n = 0;
        while n < BLOCK {
            match data.read(&mut buf[n..]) {
                Ok(0) => break,
                Ok(k) => n += k,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        if n == 0 {
            break;
        }
        total += n as u64;
        hole = buf[..n].iter().all(|&b| b == 0);
        if hole {
            file.seek(SeekFrom::Current(n as i64))?;
        } else {
            file.write_all(&buf[..n])?;
        }
    }
    if hole {
        // A trailing hole: the file is as long as its data says.
        file.set_len(total)?;
    }
    Ok(total)
}

pub(super) fn set_meta(
    fd: std::os::fd::BorrowedFd<'_>,
    meta: Meta,
    owners: bool,
) -> io::Result<()> {
    if owners {
        rustix::fs::fchown(fd, uid(meta.uid), gid(meta.gid))?;
    }
    // After the owner: a chown clears the setuid bits it would keep anyway.
    rustix::fs::fchmod(fd, Mode::from_raw_mode(meta.mode & MODE_MASK))?;
    rustix::fs::futimens(fd, &times(meta.mtime))?;
    Ok(())
}

pub(super) fn uid(raw: u32) -> Option<rustix::fs::Uid> {
    Some(rustix::fs::Uid::from_raw(raw))
}

pub(super) fn gid(raw: u32) -> Option<rustix::fs::Gid> {
    Some(rustix::fs::Gid::from_raw(raw))
}

pub(super) fn times(mtime: i64) -> Timestamps {
    let t = Timespec {
        tv_sec: mtime,
        tv_nsec: 0,
    };
    Timestamps {
        last_access: t,
        last_modification: t,
    }
}

/// An entry's mode, owner and modification time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Meta {
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub mtime: i64,
}

/// Setuid and setgid bits never land on the host: the cache is where any uid that can
/// reach it could run such a file.
const MODE_MASK: u32 = 0o1777;
