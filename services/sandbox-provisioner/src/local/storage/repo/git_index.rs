//! A workspace's git index read on the host (no process): the paths it tracks and what
//! git recorded of each file, so that patch collection can tell whether anything in
//! the workspace is untracked, or whether nothing changed at all.
//!
//! The index is the agent's file: it is read through the `.git` directory's descriptor
//! without following a link, bounded in size, and parsed without trusting a length.
//! Anything this reader does not know for certain (another hash, a split or sparse
//! index, an unmerged or flagged entry, an unknown extension) is `None`, and the caller
//! then does what it did without it.

use rustix::fs::{FileType, Mode, OFlags};
use std::{io::Read, os::fd::OwnedFd};

/// A larger index (more than about 150,000 paths) is left to git. The index is the
/// agent's file, read into the provisioner's memory: at most this much, by at most
/// [`crate::local::api::patch`]'s few scans at once.
const MAX_INDEX_BYTES: u64 = 16 << 20;
/// A larger config is not the one `git clone` wrote: left to git.
const MAX_CONFIG_BYTES: u64 = 1 << 20;
/// The longest path git's index may name here (Linux's `PATH_MAX`), and all paths
/// together (a version 4 index compresses them: a bound on what it may expand to).
const MAX_PATH: usize = 4096;
const MAX_PATH_BYTES: usize = 32 << 20;
/// SHA-1: a repository of another object format says so in its config.
const HASH: usize = 20;
/// ctime, mtime, dev, ino, mode, uid, gid, size: ten 32-bit fields.
const STAT: usize = 40;

/// An index as this reader understands it.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Index {
    /// Sorted by path.
    pub(crate) entries: Vec<Entry>,
    /// The file's trailing SHA-1 (verified): equal checksums, equal indexes.
    pub(crate) checksum: [u8; HASH],
    /// The index file's own mtime, whole seconds; 0 from [`parse`].
    pub(crate) mtime: i64,
}

/// What git recorded of one tracked path when it last looked at the file (the stat
/// fields `core.checkStat=minimal` compares, and more).
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Entry {
    pub(crate) path: Vec<u8>,
    pub(crate) mode: u32,
    /// Seconds and nanoseconds, as git stores them (32 bits each).
    pub(crate) mtime: (u32, u32),
    /// The size's low 32 bits, as git stores it.
    pub(crate) size: u32,
}

impl Index {
    /// Where in `entries` the entry of `path` is, if tracked.
    pub(crate) fn find(&self, path: &[u8]) -> Option<usize> {
        self.entries
            .binary_search_by(|e| e.path.as_slice().cmp(path))
            .ok()
    }
}

/// The index in `git` (a `.git` directory's descriptor), if its config is plain and the
/// index is of a shape this reader knows.
pub(crate) fn read(git: &OwnedFd) -> Option<Index> {
    let config = read_file(git, "config", MAX_CONFIG_BYTES)?.0;
    if !plain_config(&config) {
        return None;
    }
    let (bytes, mtime) = read_file(git, "index", MAX_INDEX_BYTES)?;
    let mut index = parse(&bytes)?;
    index.mtime = mtime;
    Some(index)
}

/// The trailing checksum (hex) of the index of the workspace `ws`, as written there.
pub(crate) fn checksum_of(ws: &std::path::Path) -> Option<String> {
    use std::{io::Seek, os::unix::fs::FileExt};
    let mut file = std::fs::File::open(ws.join(".git/index")).ok()?;
    let len = file.seek(std::io::SeekFrom::End(0)).ok()?;
    let mut sum = [0u8; HASH];
    file.read_exact_at(&mut sum, len.checked_sub(HASH as u64)?)
        .ok()?;
    Some(hex(&sum))
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// No config of another object format, worktree or index shape, and no included file:
/// git then finds the workspace and its index as this reader does. Only section names
/// and keys are looked at (a remote's URL may say anything).
fn plain_config(config: &[u8]) -> bool {
    const SECTIONS: &[&str] = &["include"];
    const KEYS: &[&str] = &["objectformat", "worktree", "sparse", "splitindex"];
    let has = |name: &[u8], markers: &[&str]| {
        markers
            .iter()
            .any(|m| name.windows(m.len()).any(|w| w == m.as_bytes()))
    };
    fn key_of(line: &[u8]) -> &[u8] {
        line.split(|&c| c == b'=').next().unwrap_or_default()
    }
    config.split(|&c| c == b'\n').all(|line| {
        let line = line.trim_ascii().to_ascii_lowercase();
        match line.strip_prefix(b"[") {
            // `[core] worktree = x` is a section and a key on one line.
            Some(rest) => {
                let end = rest.iter().position(|&c| c == b']').unwrap_or(rest.len());
                let after = rest.get(end + 1..).unwrap_or_default();
                !has(&rest[..end], SECTIONS) && !has(key_of(after), KEYS)
            }
            None => !has(key_of(&line), KEYS),
        }
    })
}

/// A regular file under `dir`, read whole if it is at most `max` bytes, and its mtime.
fn read_file(dir: &OwnedFd, name: &str, max: u64) -> Option<(Vec<u8>, i64)> {
    let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC;
    let fd = rustix::fs::openat(dir, name, flags, Mode::empty()).ok()?;
    let st = rustix::fs::fstat(&fd).ok()?;
    let len = u64::try_from(st.st_size).ok()?;
    if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile || len > max {
        return None;
    }
    let mut bytes = Vec::with_capacity(usize::try_from(len).ok()?);
    std::fs::File::from(fd)
        .take(max + 1)
        .read_to_end(&mut bytes)
        .ok()?;
    (bytes.len() as u64 <= max).then_some((bytes, st.st_mtime))
}

/// An index (versions 2 to 4, its checksum right) whose every entry is a plain, merged
/// file, link or submodule; `None` for anything else.
fn parse(b: &[u8]) -> Option<Index> {
    use sha1::Digest;
    let body = b.len().checked_sub(HASH)?;
    if sha1::Sha1::digest(&b[..body]).as_slice() != &b[body..] {
        return None;
    }
    let mut r = Reader { b, at: 0 };
    let (version, count) = header(&mut r)?;
    // Every entry takes more than 62 bytes: a count the file cannot hold is not trusted
    // with an allocation.
    let mut entries: Vec<Entry> = Vec::with_capacity(count.min(b.len() / 62));
    let mut paths = Paths::default();
    for _ in 0..count {
        entries.push(entry(&mut r, version, &mut paths)?);
    }
    skip_extensions(&mut r)?;
    entries.sort_unstable_by(|a, b| a.path.cmp(&b.path));
    Some(Index {
        entries,
        checksum: b[body..].try_into().ok()?,
        mtime: 0,
    })
}

/// The signature, then the version (2 to 4) and the entry count.
fn header(r: &mut Reader<'_>) -> Option<(u32, usize)> {
    if r.take(4)? != b"DIRC" {
        return None;
    }
    let version = r.u32()?;
    if !(2..=4).contains(&version) {
        return None;
    }
    let count = usize::try_from(r.u32()?).ok()?;
    Some((version, count))
}

/// The paths read so far: version 4 writes each as a change of the one before it.
#[derive(Default)]
struct Paths {
    last: Vec<u8>,
    bytes: usize,
}

/// One entry, a plain, merged file, link or submodule; `None` for anything else.
fn entry(r: &mut Reader<'_>, version: u32, paths: &mut Paths) -> Option<Entry> {
    let start = r.at;
    let stat = r.take(STAT)?;
    let field = |i: usize| {
        stat[i * 4..i * 4 + 4]
            .try_into()
            .ok()
            .map(u32::from_be_bytes)
    };
    let mode = field(6)?;
    if !matches!(mode, 0o100644 | 0o100755 | 0o120000 | 0o160000) {
        return None;
    }
    r.take(HASH)?;
    let flags = r.u16()?;
    // assume-valid, extended (skip-worktree, intent-to-add), or a stage: git would
    // not answer from the files alone.
    if flags & 0xf000 != 0 {
        return None;
    }
    let path = if version == 4 {
        prefixed_path(r, paths)?
    } else {
        padded_path(r, start)?
    };
    if path.is_empty() {
        return None;
    }
    paths.last.clone_from(&path);
    Some(Entry {
        path,
        mode,
        mtime: (field(2)?, field(3)?),
        size: field(9)?,
    })
}

/// A version 4 path: how much of the one before it to keep, then the rest.
fn prefixed_path(r: &mut Reader<'_>, paths: &mut Paths) -> Option<Vec<u8>> {
    let strip = usize::try_from(r.varint()?).ok()?;
    let keep = paths.last.len().checked_sub(strip)?;
    let mut p = paths.last[..keep].to_vec();
    p.extend_from_slice(r.until_nul()?);
    // Each path may repeat the one before it whole: without these bounds a small
    // index could make the host build paths of quadratic size.
    paths.bytes += p.len();
    if p.len() > MAX_PATH || paths.bytes > MAX_PATH_BYTES {
        return None;
    }
    Some(p)
}

/// A version 2 or 3 path, whole, in an entry that began at `start`.
fn padded_path(r: &mut Reader<'_>, start: usize) -> Option<Vec<u8>> {
    let p = r.until_nul()?.to_vec();
    // Padded with one to eight NULs (the one read included) to a multiple of 8.
    let used = r.at - start;
    r.take((8 - used % 8) % 8)?;
    Some(p)
}

/// The extensions after the entries (each skipped), then nothing but the checksum.
fn skip_extensions(r: &mut Reader<'_>) -> Option<()> {
    while r.b.len() - r.at > HASH {
        let sig = r.take(4)?;
        let len = usize::try_from(r.u32()?).ok()?;
        if !matches!(
            sig,
            b"TREE" | b"REUC" | b"UNTR" | b"EOIE" | b"IEOT" | b"FSMN"
        ) {
            return None;
        }
        r.take(len)?;
    }
    (r.b.len() - r.at == HASH).then_some(())
}

struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let s = self.b.get(self.at..self.at.checked_add(n)?)?;
        self.at += n;
        Some(s)
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_be_bytes(self.take(4)?.try_into().ok()?))
    }
    fn u16(&mut self) -> Option<u16> {
        Some(u16::from_be_bytes(self.take(2)?.try_into().ok()?))
    }
    /// The bytes up to a NUL, which is consumed too.
    fn until_nul(&mut self) -> Option<&'a [u8]> {
        let rest = self.b.get(self.at..)?;
        let n = rest.iter().position(|&c| c == 0)?;
        self.at += n + 1;
        Some(&rest[..n])
    }
    /// git's offset varint (varint.c): each continuation adds one before shifting.
    fn varint(&mut self) -> Option<u64> {
        let mut c = self.take(1)?[0];
        let mut v = u64::from(c & 0x7f);
        while c & 0x80 != 0 {
            c = self.take(1)?[0];
            v = v.checked_add(1)?.checked_mul(128)? | u64::from(c & 0x7f);
        }
        Some(v)
    }
}

#[cfg(test)]
#[path = "git_index_tests.rs"]
mod tests;
