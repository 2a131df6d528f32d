//! One layer applied onto a root filesystem, as the OCI image spec describes: a tar
//! (gzip or not) whose `.wh.<name>` entries delete `<name>` from the layers below and
//! whose `.wh..wh..opq` empties its directory of what the layers below put there. The
//! uncompressed tar must hash to the layer's `diff_id`.
//!
//! An image is input from whoever names it, so nothing in a layer may land outside the
//! root (`..`, absolute paths, links out: the tar crate's `unpack_in` refuses them),
//! device nodes are skipped (bubblewrap gives a sandbox its own `/dev`), and setuid and
//! setgid bits are dropped: the cache is on the host, where such a file would be a
//! way up for anyone who can reach it.

use super::error::ImageError;
use crate::local::store::remove_all;
use sha2::{Digest as _, Sha256};
use std::{
    fs::File,
    io::{BufReader, Read},
    path::{Component, Path, PathBuf},
};

const WHITEOUT: &str = ".wh.";
const OPAQUE: &str = ".wh..wh..opq";

/// Apply the layer file `layer` onto `rootfs`, checking it against `diff_id`.
pub fn apply(layer: &Path, diff_id: &str, rootfs: &Path) -> Result<(), ImageError> {
    // The deletions are made before anything of this layer is written, so they touch
    // lower layers only.
    for d in checked_whiteouts(layer, diff_id)? {
        match d {
            Deletion::Entry(p) => remove_all(&rootfs.join(p)),
            Deletion::Contents(dir) => std::fs::read_dir(rootfs.join(dir))
                .into_iter()
                .flatten()
                .flatten()
                .try_for_each(|c| remove_all(&c.path())),
        }
        .map_err(|e| ImageError::Io(format!("apply a whiteout: {e}")))?;
    }
    unpack(layer, rootfs)
}

/// A first pass over the layer: its digest checked against `diff_id`, its paths'
/// shape, and the deletions its whiteouts ask for.
fn checked_whiteouts(layer: &Path, diff_id: &str) -> Result<Vec<Deletion>, ImageError> {
    let mut deletions = Vec::new();
    let mut hashed = Hashing::new(open(layer)?);
    {
        let mut tar = tar::Archive::new(&mut hashed);
        for entry in tar.entries().map_err(|e| bad(layer, e))? {
            let entry = entry.map_err(|e| bad(layer, e))?;
            let path = relative(&entry.path().map_err(|e| bad(layer, e))?)?;
            if let Some(d) = whiteout(&path) {
                deletions.push(d);
            }
        }
    }
    std::io::copy(&mut hashed, &mut std::io::sink()).map_err(|e| bad(layer, e))?;
    let got = format!("sha256:{:x}", hashed.hash.finalize());
    if got != diff_id {
        return Err(ImageError::DigestMismatch {
            what: format!("layer {}", layer.display()),
            expected: diff_id.to_owned(),
            got,
        });
    }
    Ok(deletions)
}

/// The layer's entries written into `rootfs`: no whiteouts, device nodes or fifos, no
/// setuid or setgid bit.
fn unpack(layer: &Path, rootfs: &Path) -> Result<(), ImageError> {
    let mut tar = tar::Archive::new(open(layer)?);
    tar.set_preserve_permissions(true);
    tar.set_preserve_ownerships(rustix::process::geteuid().is_root());
    tar.set_unpack_xattrs(false);
    tar.set_overwrite(true);
    tar.set_mask(0o6000);
    for entry in tar.entries().map_err(|e| bad(layer, e))? {
        let mut entry = entry.map_err(|e| bad(layer, e))?;
        let path = relative(&entry.path().map_err(|e| bad(layer, e))?)?;
        let kind = entry.header().entry_type();
        if whiteout(&path).is_some()
            || kind.is_character_special()
            || kind.is_block_special()
            || kind.is_fifo()
            || path.as_os_str().is_empty()
        {
            continue;
        }
        // A path that changes kind between layers (a directory that became a file, a
        // file that became a link) is replaced, not merged.
        let target = rootfs.join(&path);
        if let Ok(meta) = std::fs::symlink_metadata(&target)
            && !(kind.is_dir() && meta.is_dir())
        {
            remove_all(&target)
                .map_err(|e| ImageError::Io(format!("replace {}: {e}", path.display())))?;
        }
        entry.unpack_in(rootfs).map_err(|e| {
            let why =
                std::error::Error::source(&e).map_or_else(|| e.to_string(), ToString::to_string);
            ImageError::NotAnImage(format!("layer entry {}: {why}", path.display()))
        })?;
    }
    Ok(())
}

enum Deletion {
    Entry(PathBuf),
    Contents(PathBuf),
}

fn whiteout(path: &Path) -> Option<Deletion> {
    let name = path.file_name()?.to_str()?;
    let parent = path.parent().unwrap_or(Path::new("")).to_path_buf();
    if name == OPAQUE {
        Some(Deletion::Contents(parent))
    } else {
        name.strip_prefix(WHITEOUT)
            .filter(|n| !n.is_empty())
            .map(|n| Deletion::Entry(parent.join(n)))
    }
}

/// A layer path made relative (`./usr/bin` → `usr/bin`); one that climbs out is refused.
fn relative(path: &Path) -> Result<PathBuf, ImageError> {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::Normal(n) => out.push(n),
            Component::CurDir | Component::RootDir => {}
            Component::ParentDir | Component::Prefix(_) => {
                return Err(ImageError::NotAnImage(format!(
                    "a layer entry climbs out of the image: {}",
                    path.display()
                )));
            }
        }
    }
    Ok(out)
}

fn bad(layer: &Path, e: impl std::fmt::Display) -> ImageError {
    ImageError::NotAnImage(format!("layer {} is not a tar: {e}", layer.display()))
}

/// The layer's tar, uncompressed when it is gzip (sniffed, as media types lie in old
/// archives).
fn open(layer: &Path) -> Result<Box<dyn Read>, ImageError> {
    let mut file =
        BufReader::new(File::open(layer).map_err(|e| {
            ImageError::NotAnImage(format!("missing layer {}: {e}", layer.display()))
        })?);
    let gz = std::io::BufRead::fill_buf(&mut file)
        .map(|b| b.starts_with(&[0x1f, 0x8b]))
        .unwrap_or(false);
    Ok(if gz {
        Box::new(flate2::read::GzDecoder::new(file))
    } else {
        Box::new(file)
    })
}

struct Hashing<R> {
    inner: R,
    hash: Sha256,
}

impl<R> Hashing<R> {
    fn new(inner: R) -> Self {
        Self {
            inner,
            hash: Sha256::new(),
        }
    }
}

impl<R: Read> Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hash.update(&buf[..n]);
        Ok(n)
    }
}
