//! Layers applied onto a root filesystem, as the OCI image spec describes: tars (gzip
//! or not) whose `.wh.<name>` entries delete `<name>` from the layers below and whose
//! `.wh..wh..opq` empties its directory of what the layers below put there. Each
//! uncompressed tar must hash to its layer's `diff_id`.
//!
//! An image is input from whoever names it. Every change lands beneath the root by
//! descriptor ([`crate::local::base::confined`]): an entry or whiteout whose path runs through a
//! link a lower layer made is refused, never applied to what the link names; hard
//! links name entries beneath the root. Device nodes and fifos are skipped (bubblewrap
//! gives a sandbox its own `/dev`); setuid and setgid bits are dropped. What a layer
//! unpacks to is bounded ([`UnpackLimits`]: bytes and entries, per image), counted as the
//! layer is read, so a small gzip that inflates to gigabytes stops at the bound.
//!
//! Three reads of each layer: the first checks its digest, bounds and the size of its
//! extension headers (long names, PAX records: kept in memory by the tar reader) on
//! raw headers; the second lists its whiteouts, which apply before anything of the
//! layer is written (they touch lower layers only); the third writes.

use super::error::ImageError;
use crate::local::base::{
    confined,
    confined::{ConfineError, Tree},
};
use sha2::{Digest as _, Sha256};
use std::{
    fs::File,
    io::{BufReader, Read, Seek},
    path::{Path, PathBuf},
};

const WHITEOUT: &str = ".wh.";
const OPAQUE: &str = ".wh..wh..opq";
/// A long name or PAX record larger than this is no image's.
const MAX_EXTENSION_BYTES: u64 = 1 << 20;

/// What an image may still unpack to.
#[derive(Debug, Clone, Copy)]
pub struct UnpackLimits {
    pub bytes: u64,
    pub entries: u64,
}

/// One layer: its file (any position) and the digest of its uncompressed tar.
#[derive(Debug)]
pub struct Layer {
    pub file: File,
    pub diff_id: String,
}

/// Apply `layers`, lowest first, onto the tree at `rootfs`, within `budget`.
pub fn apply_all(
    layers: &[Layer],
    rootfs: &Path,
    mut budget: UnpackLimits,
    owners: bool,
) -> Result<(), ImageError> {
    let limits = budget;
    for (n, layer) in layers.iter().enumerate() {
        let name = format!("layer {} ({})", n + 1, layer.diff_id);
        check(layer, &name, &mut budget, limits)?;
        let deletions = whiteouts(layer, &name)?;
        let mut tree = Tree::open(rootfs, owners)
            .map_err(|e| ImageError::Io(format!("open the root filesystem: {e}")))?;
        for d in deletions {
            match &d {
                Deletion::Entry(p) => tree.remove(p),
                Deletion::Contents(dir) => tree.clear(dir),
            }
            .map_err(|e| refused(&name, e))?;
        }
        write(layer, &name, &mut tree)?;
        tree.finish().map_err(|e| refused(&name, e))?;
    }
    Ok(())
}

/// The first read: the digest, the bounds, and the extension headers' sizes, on raw
/// headers (nothing of an entry's data kept).
fn check(
    layer: &Layer,
    name: &str,
    budget: &mut UnpackLimits,
    limits: UnpackLimits,
) -> Result<(), ImageError> {
    let over = |what: String| {
        ImageError::TooLarge(format!(
            "{name} {what} (FORKYARD_IMAGE_MAX_BYTES {} bytes, FORKYARD_IMAGE_MAX_ENTRIES {} entries, per image)",
            limits.bytes, limits.entries
        ))
    };
    let mut hashed = Hashing::new(open(layer, name)?, budget.bytes);
    let mut expanded: u64 = 0;
    let read = read_headers(&mut hashed, budget, &mut expanded);
    if hashed.over {
        return Err(over("unpacks to more bytes than an image may".into()));
    }
    match read {
        Err(e) => return Err(bad(name, e)),
        Ok(Some(why)) if why.contains("header record") => {
            return Err(ImageError::NotAnImage(format!("{name} {why}")));
        }
        Ok(Some(why)) => return Err(over(why)),
        Ok(None) => {}
    }
    std::io::copy(&mut hashed, &mut std::io::sink()).map_err(|e| bad(name, e))?;
    if hashed.over {
        return Err(over("unpacks to more bytes than an image may".into()));
    }
    budget.bytes = budget.bytes.saturating_sub(hashed.count.max(expanded));
    let got = format!("sha256:{:x}", hashed.hash.finalize());
    if got != layer.diff_id {
        return Err(ImageError::DigestMismatch {
            what: name.to_owned(),
            expected: layer.diff_id.clone(),
            got,
        });
    }
    Ok(())
}

/// The layer's raw headers, counted against `budget` (entries, and in `expanded` the
/// bytes they unpack to): `Some(why)` at the first that is past a bound.
fn read_headers(
    layer: impl std::io::Read,
    budget: &mut UnpackLimits,
    expanded: &mut u64,
) -> std::io::Result<Option<String>> {
    let mut tar = tar::Archive::new(layer);
    for entry in tar.entries()?.raw(true) {
        let entry = entry?;
        let kind = entry.header().entry_type();
        let extension = kind.is_gnu_longname()
            || kind.is_gnu_longlink()
            || kind.is_pax_local_extensions()
            || kind.is_pax_global_extensions();
        if extension && entry.size() > MAX_EXTENSION_BYTES {
            return Ok(Some(format!("has a {} byte header record", entry.size())));
        }
        if budget.entries == 0 {
            return Ok(Some("has more entries than an image may".into()));
        }
        budget.entries -= 1;
        *expanded = expanded.saturating_add(entry.size());
        if *expanded > budget.bytes {
            return Ok(Some("unpacks to more bytes than an image may".into()));
        }
    }
    Ok(None)
}

/// The second read: the deletions the layer's whiteouts ask for.
fn whiteouts(layer: &Layer, name: &str) -> Result<Vec<Deletion>, ImageError> {
    let mut deletions = Vec::new();
    let mut tar = tar::Archive::new(open(layer, name)?);
    for entry in tar.entries().map_err(|e| bad(name, e))? {
        let entry = entry.map_err(|e| bad(name, e))?;
        let path = relative(name, &entry.path().map_err(|e| bad(name, e))?)?;
        if let Some(d) = whiteout(name, &path)? {
            deletions.push(d);
        }
    }
    Ok(deletions)
}

/// The third read: the layer's entries written, but its whiteouts.
fn write(layer: &Layer, name: &str, tree: &mut Tree) -> Result<(), ImageError> {
    let mut tar = tar::Archive::new(open(layer, name)?);
    for entry in tar.entries().map_err(|e| bad(name, e))? {
        let mut entry = entry.map_err(|e| bad(name, e))?;
        let path = relative(name, &entry.path().map_err(|e| bad(name, e))?)?;
        if whiteout(name, &path)?.is_none() {
            write_entry(tree, &mut entry, name)?;
        }
    }
    Ok(())
}

/// One entry of a tar written into `tree` (of the layer or archive `name`).
pub fn write_entry<R: Read>(
    tree: &mut Tree,
    entry: &mut tar::Entry<'_, R>,
    name: &str,
) -> Result<(), ImageError> {
    tree.entry(entry).map_err(|e| refused(name, e))
}

enum Deletion {
    Entry(PathBuf),
    Contents(PathBuf),
}

fn whiteout(layer: &str, path: &Path) -> Result<Option<Deletion>, ImageError> {
    let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
        return Ok(None);
    };
    let parent = path.parent().unwrap_or(Path::new("")).to_path_buf();
    if name == OPAQUE {
        return Ok(Some(Deletion::Contents(parent)));
    }
    match name.strip_prefix(WHITEOUT) {
        None => Ok(None),
        Some("" | "." | "..") => Err(ImageError::Refused(format!(
            "{layer}: the whiteout {} names no entry of its directory",
            path.display()
        ))),
        Some(n) => Ok(Some(Deletion::Entry(parent.join(n)))),
    }
}

/// A layer path made plain; one that climbs out is refused.
fn relative(layer: &str, path: &Path) -> Result<PathBuf, ImageError> {
    confined::plain(path).map_err(|e| refused(layer, e))
}

fn refused(layer: &str, e: ConfineError) -> ImageError {
    match e {
        ConfineError::Io(_, ref io) if is_host_trouble(io) => {
            ImageError::Io(format!("{layer}: {e}"))
        }
        ConfineError::ThroughLink(_) | ConfineError::BadPath(..) => {
            ImageError::Refused(format!("{layer}: the entry {e} of the image"))
        }
        ConfineError::Io(..) => ImageError::NotAnImage(format!("{layer}: {e}")),
    }
}

/// Errors of the host's, not of the image's making.
fn is_host_trouble(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ENOSPC | libc::EDQUOT | libc::EROFS | libc::EIO | libc::ENOMEM)
    )
}

fn bad(layer: &str, e: impl std::fmt::Display) -> ImageError {
    ImageError::NotAnImage(format!("{layer} is not a tar: {e}"))
}

/// The layer's tar from its start, uncompressed when it is gzip (sniffed, as media
/// types lie in old archives).
fn open<'a>(layer: &'a Layer, name: &str) -> Result<Box<dyn Read + 'a>, ImageError> {
    (&layer.file)
        .rewind()
        .map_err(|e| ImageError::Io(format!("read {name}: {e}")))?;
    let mut file = BufReader::new(&layer.file);
    let gz = std::io::BufRead::fill_buf(&mut file)
        .map(|b| b.starts_with(&[0x1f, 0x8b]))
        .unwrap_or(false);
    Ok(if gz {
        Box::new(flate2::read::GzDecoder::new(file))
    } else {
        Box::new(file)
    })
}

/// The uncompressed stream hashed and counted; past `limit` bytes it ends in an error.
struct Hashing<R> {
    inner: R,
    hash: Sha256,
    count: u64,
    limit: u64,
    over: bool,
}

impl<R> Hashing<R> {
    fn new(inner: R, limit: u64) -> Self {
        Self {
            inner,
            hash: Sha256::new(),
            count: 0,
            limit,
            over: false,
        }
    }
}

impl<R: Read> Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.count = self.count.saturating_add(n as u64);
        if self.count > self.limit {
            self.over = true;
            return Err(std::io::Error::other("past the image's bound"));
        }
        self.hash.update(&buf[..n]);
        Ok(n)
    }
}
