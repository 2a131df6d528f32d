//! Workspace snapshots: `<snapshot_dir>/<id>.tar.gz` (gzip tarball of the workspace,
//! symlinks stored as links, never followed) beside `<id>.json` (where it came from).
//! Only ids cross Temporal; the data stays in the store.

use crate::{
    error::{ProvisionerError, Result},
    local::store::{self, Record},
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
            tar.follow_symlinks(false);
            tar.append_dir_all(".", workspace)?;
            tar.into_inner()?.finish()?.sync_all()
        };
        if let Err(e) = write() {
            let _ = std::fs::remove_file(&tmp);
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

    /// Unpack snapshot `id` into `dest` (which must not exist yet; blocking).
    pub fn unpack(&self, id: &str, dest: &Path) -> Result<()> {
        self.meta(id)?;
        let file = std::fs::File::open(self.tarball(id))
            .map_err(|_| ProvisionerError::NotFound(format!("snapshot {id}")))?;
        let mut tar = tar::Archive::new(flate2::read::GzDecoder::new(file));
        tar.set_preserve_permissions(true);
        tar.set_unpack_xattrs(false);
        std::fs::create_dir(dest).map_err(|e| ProvisionerError::internal("create workspace", e))?;
        tar.unpack(dest).map_err(|e| {
            let _ = store::remove_all(dest);
            ProvisionerError::internal("unpack snapshot", e)
        })
    }
}
