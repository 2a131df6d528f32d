//! Workspace snapshots: `<snapshot_dir>/<id>.tar.gz` (gzip tarball of the workspace,
//! symlinks stored as links, never followed) beside `<id>.json` (where it came from).
//! Only ids cross Temporal; the data stays in the store.

use crate::{
    error::{ProvisionerError, Result},
    local::{
        base::{confined, fd_walk, fs::remove_all},
        storage::store::Record,
    },
};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Meta {
    pub id: String,
    pub source_sandbox: String,
    pub repo: String,
    pub branch: String,
    pub base_commit: String,
    pub created_unix_ms: i64,
    pub bytes: u64,
    /// The source sandbox's labels (its run and fork): what the janitor sweeps by.
    #[serde(default)]
    pub labels: std::collections::HashMap<String, String>,
}

#[derive(Debug, Clone)]
pub struct Snapshots {
    dir: PathBuf,
}

fn check_id(id: &str) -> Result<()> {
    let ok = id.starts_with("snap-")
        && id.len() <= 64
        && id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-');
    if ok {
        Ok(())
    } else {
        Err(ProvisionerError::invalid(
            "snapshot_id",
            format!("{id:?} is not a snapshot id"),
        ))
    }
}

impl Snapshots {
    pub fn open(dir: &Path) -> std::io::Result<Self> {
        std::fs::create_dir_all(dir)?;
        std::fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o700))?;
        Ok(Self {
            dir: dir.to_owned(),
        })
    }

    fn tarball(&self, id: &str) -> PathBuf {
        self.dir.join(format!("{id}.tar.gz"))
    }

    /// Archive `workspace` (blocking) and record where it came from.
    pub fn persist(&self, workspace: &Path, record: &Record, now_ms: i64) -> Result<Meta> {
        let id = format!("snap-{}", uuid::Uuid::new_v4().simple());
        let tmp = self.dir.join(format!(".{id}.tmp"));
        let write = || -> std::io::Result<()> {
            let file = std::fs::File::create(&tmp)?;
            let gz = flate2::write::GzEncoder::new(file, flate2::Compression::fast());
            let mut tar = tar::Builder::new(gz);
            archive(
                &mut tar,
                workspace,
                save_bound(workspace, record.disk_bytes)?,
            )?;
            tar.into_inner()?.finish()?.sync_all()
        };
        if let Err(e) = write() {
            let _ = std::fs::remove_file(&tmp);
            if let Some(too_big) = e.get_ref().and_then(|e| e.downcast_ref::<TooBig>()) {
                return Err(ProvisionerError::FailedPrecondition(format!(
                    "the workspace holds {too_big} (a sparse file counts its full size); it cannot be saved"
                )));
            }
            if e.kind() == std::io::ErrorKind::WouldBlock {
                return Err(ProvisionerError::FailedPrecondition(
                    "a file of the workspace is leased by a process of the sandbox; stop the sandbox and persist again".into(),
                ));
            }
            return Err(ProvisionerError::internal("write snapshot", e));
        }
        let bytes = std::fs::metadata(&tmp).map(|m| m.len()).unwrap_or(0);
        let meta = Meta {
            id: id.clone(),
            source_sandbox: record.id.clone(),
            repo: record.repo.clone(),
            branch: record.branch.clone(),
            base_commit: record.base_commit.clone(),
            created_unix_ms: now_ms,
            bytes,
            labels: record.labels.clone(),
        };
        let json = serde_json::to_vec_pretty(&meta)
            .map_err(|e| ProvisionerError::internal("encode snapshot meta", e))?;
        std::fs::write(self.dir.join(format!("{id}.json")), json)
            .and_then(|()| std::fs::rename(&tmp, self.tarball(&id)))
            .map_err(|e| ProvisionerError::internal("store snapshot", e))?;
        Ok(meta)
    }

    pub fn meta(&self, id: &str) -> Result<Meta> {
        check_id(id)?;
        let raw = std::fs::read(self.dir.join(format!("{id}.json")))
            .map_err(|_| ProvisionerError::NotFound(format!("snapshot {id}")))?;
        serde_json::from_slice(&raw)
            .map_err(|e| ProvisionerError::internal("read snapshot meta", e))
    }

    /// Remove snapshot `id`; `false` when it was not there.
    pub fn delete(&self, id: &str) -> Result<bool> {
        check_id(id)?;
        let meta = self.dir.join(format!("{id}.json"));
        let existed = meta.exists();
        // The tarball first: a meta without a tarball is a snapshot that cannot be
        // unpacked, and a second delete removes it.
        for path in [self.tarball(id), meta] {
            match std::fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(ProvisionerError::internal("delete snapshot", e)),
            }
        }
        Ok(existed)
    }

    /// Every snapshot's meta (unreadable ones are skipped).
    pub fn list(&self) -> Result<Vec<Meta>> {
        let entries = std::fs::read_dir(&self.dir)
            .map_err(|e| ProvisionerError::internal("list snapshots", e))?;
        let mut out = Vec::new();
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if let Some(id) = name.strip_suffix(".json")
                && let Ok(meta) = self.meta(id)
            {
                out.push(meta);
            }
        }
        out.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(out)
    }

    /// Unpack snapshot `id` into `dest` (which must not exist yet; blocking), for a
    /// sandbox whose disk limit is `disk_bytes` (0: none). More file data than that, or
    /// than the free space of `dest`'s filesystem, is refused and nothing is left: a
    /// snapshot saved without a limit (or before saves had one) could hold a sparse file
    /// of a terabyte, written back as zeros.
    pub fn unpack(&self, id: &str, dest: &Path, disk_bytes: u64) -> Result<()> {
        self.meta(id)?;
        let file = std::fs::File::open(self.tarball(id))
            .map_err(|_| ProvisionerError::NotFound(format!("snapshot {id}")))?;
        let mut tar = tar::Archive::new(flate2::read::GzDecoder::new(file));
        std::fs::create_dir(dest).map_err(|e| ProvisionerError::internal("create workspace", e))?;
        let bound = restore_bound(dest, disk_bytes);
        unpack_within(&mut tar, dest, bound).map_err(|e| {
            let _ = remove_all(dest);
            match e.get_ref().and_then(|e| e.downcast_ref::<TooBig>()) {
                Some(too_big) => ProvisionerError::FailedPrecondition(format!(
                    "snapshot {id} holds {too_big}; it cannot be restored"
                )),
                None => ProvisionerError::internal("unpack snapshot", e),
            }
        })
    }
}

/// At most this much file data is saved: the sandbox's disk limit, or without one the
/// size of the workspace's filesystem (no sandbox holds more; a sparse file can claim
/// any size).
fn save_bound(workspace: &Path, disk_bytes: u64) -> std::io::Result<Bound> {
    if disk_bytes != 0 {
        return Ok(Bound::DiskLimit(disk_bytes));
    }
    let fs = rustix::fs::statvfs(workspace)?;
    Ok(Bound::Filesystem(fs.f_blocks.saturating_mul(fs.f_frsize)))
}

/// At most this much file data is restored at `dest`: the sandbox's disk limit and the
/// free space of its filesystem, whichever is less.
fn restore_bound(dest: &Path, disk_bytes: u64) -> Bound {
    let free = rustix::fs::statvfs(dest)
        .map(|fs| fs.f_bavail.saturating_mul(fs.f_frsize))
        .unwrap_or(u64::MAX);
    if disk_bytes != 0 && disk_bytes <= free {
        Bound::DiskLimit(disk_bytes)
    } else {
        Bound::FreeSpace(free)
    }
}

/// The snapshot's entries written beneath `dest` by descriptor
/// (`crate::local::base::confined`: a sandbox made them, and a link it left never leads a
/// restore out), zeros as holes, file data counted as it goes ([`TooBig`] past
/// `bound`); directories' modes set last, deepest first, so a read-only one never
/// blocks what it holds.
fn unpack_within<R: std::io::Read>(
    tar: &mut tar::Archive<R>,
    dest: &Path,
    bound: Bound,
) -> std::io::Result<()> {
    let mut tree = confined::Tree::open(dest, false)?;
    let mut data_bytes = 0u64;
    for entry in tar.entries()? {
        let mut entry = entry?;
        // The size tar unpacks (a PAX header's over the entry's own).
        data_bytes = data_bytes.saturating_add(entry.size());
        if data_bytes > bound.bytes() {
            return Err(std::io::Error::other(TooBig(bound)));
        }
        tree.entry(&mut entry).map_err(std::io::Error::other)?;
    }
    tree.finish().map_err(std::io::Error::other)
}

/// How much file data a snapshot may hold, and why.
#[derive(Debug, Clone, Copy)]
enum Bound {
    DiskLimit(u64),
    Filesystem(u64),
    FreeSpace(u64),
}

impl Bound {
    fn bytes(self) -> u64 {
        match self {
            Self::DiskLimit(b) | Self::Filesystem(b) | Self::FreeSpace(b) => b,
        }
    }
}

/// File data past a [`Bound`]: a snapshot bigger than the sandbox could ever hold (a
/// sparse file's holes are read, saved and restored as zeros).
#[derive(Debug)]
struct TooBig(Bound);

impl std::fmt::Display for TooBig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Bound::DiskLimit(b) => write!(f, "more file data than its disk limit of {b} bytes"),
            Bound::Filesystem(b) => {
                write!(f, "more file data than the {b} bytes its filesystem holds")
            }
            Bound::FreeSpace(b) => {
                write!(
                    f,
                    "more file data than the {b} bytes free on the provisioner's disk"
                )
            }
        }
    }
}

impl std::error::Error for TooBig {}

/// Append `workspace` to `tar` by descriptor. The sandbox may still run while it is
/// saved, and this runs as root: a path read twice (listed as a directory, then opened)
/// could by then be a symlink to `/etc`, and its files would be restored to the sandbox's
/// uid later. So each entry is pinned with `O_NOFOLLOW` and read through that pin:
/// symlinks are stored as links, a file's bytes are the pinned inode's. A file that grows
/// or shrinks while it is read is cut or zero-padded to its size when pinned, so the
/// archive stays well formed. Only directories, regular files and symlinks are saved
/// (a FIFO would come back as a regular file, sockets and devices cannot be restored
/// into a sandbox); set-id bits are dropped. More file data than `bound` is refused
/// ([`TooBig`]).
fn archive<W: std::io::Write>(
    tar: &mut tar::Builder<W>,
    workspace: &Path,
    bound: Bound,
) -> std::io::Result<()> {
    use std::io::Read;
    use tar::{EntryType, Header};
    let mut data_bytes = 0u64;
    // A directory read can list an entry twice when it is renamed meanwhile (XFS; not
    // ext4): archived twice, as a link and then as a directory, the path would make the
    // snapshot one that unpack refuses. The first one stands.
    let mut archived = std::collections::HashSet::new();
    fd_walk::walk(workspace, |entry| {
        let name = if entry.rel.as_os_str().is_empty() {
            PathBuf::from(".")
        } else {
            Path::new(".").join(entry.rel)
        };
        if !archived.insert(name.clone()) {
            return Ok(false);
        }
        let st = entry.stat;
        let mut header = Header::new_gnu();
        header.set_mode(st.st_mode & 0o1777);
        header.set_uid(u64::from(st.st_uid));
        header.set_gid(u64::from(st.st_gid));
        header.set_mtime(u64::try_from(st.st_mtime).unwrap_or(0));
        header.set_size(0);
        if entry.is_dir() {
            header.set_entry_type(EntryType::Directory);
            tar.append_data(&mut header, &name, std::io::empty())?;
            return Ok(true);
        }
        if entry.is_symlink() {
            header.set_entry_type(EntryType::Symlink);
            tar.append_link(&mut header, &name, entry.read_link()?)?;
        } else if entry.is_file() {
            let size = u64::try_from(st.st_size).unwrap_or(0);
            data_bytes = data_bytes.saturating_add(size);
            if data_bytes > bound.bytes() {
                return Err(std::io::Error::other(TooBig(bound)));
            }
            header.set_entry_type(EntryType::Regular);
            header.set_size(size);
            let data = entry
                .open_file()?
                .take(size)
                .chain(std::io::repeat(0))
                .take(size);
            tar.append_data(&mut header, &name, data)?;
        }
        Ok(false)
    })
}

#[cfg(test)]
#[path = "snapshot_tests.rs"]
mod tests;
