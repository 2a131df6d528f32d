//! Reading and writing workspace files from the host, safely: every path is resolved by
//! the kernel *inside* the workspace (`openat2` with `RESOLVE_IN_ROOT`), so a symlink or
//! `..` the agent planted can never reach a host file.

use crate::{
    error::{ProvisionerError, Result},
    local::{base::shared::is_shared, core::provisioner::Provisioner, isolation::uids},
};
use forkyard_proto::sandbox::v1::{
    ReadFileRequest, ReadFileResponse, WriteFileRequest, WriteFileResponse,
};
use rustix::fs::{Mode, OFlags, ResolveFlags};
use std::{
    io::{Read, Write},
    path::Path,
};

pub const DEFAULT_READ_BYTES: u64 = 16 * 1024 * 1024;
pub const MAX_FILE_BYTES: u64 = 64 * 1024 * 1024;

fn open_in(workspace: &Path, path: &str, flags: OFlags, mode: u32) -> Result<std::fs::File> {
    let rel = path
        .trim_start_matches("/workspace/")
        .trim_start_matches('/');
    if rel.is_empty() || rel.contains('\0') {
        return Err(ProvisionerError::invalid(
            "path",
            "must name a file in the workspace",
        ));
    }
    let root = std::fs::File::open(workspace)
        .map_err(|e| ProvisionerError::internal("open workspace", e))?;
    let resolve = ResolveFlags::IN_ROOT | ResolveFlags::NO_MAGICLINKS | ResolveFlags::NO_XDEV;
    let fd = rustix::fs::openat2(
        &root,
        rel,
        flags | OFlags::CLOEXEC,
        Mode::from_raw_mode(mode),
        resolve,
    )
    .map_err(|e| match e {
        rustix::io::Errno::NOENT => ProvisionerError::NotFound(format!("file {path}")),
        rustix::io::Errno::ISDIR => ProvisionerError::invalid("path", "is a directory"),
        // A FIFO opened for writing without blocking, with no reader.
        rustix::io::Errno::NXIO => ProvisionerError::invalid("path", "is not a regular file"),
        e => ProvisionerError::FailedPrecondition(format!("cannot open {path}: {e}")),
    })?;
    Ok(std::fs::File::from(fd))
}

impl Provisioner {
    pub async fn read_file(&self, req: ReadFileRequest) -> Result<ReadFileResponse> {
        self.entry(&req.sandbox_id)?;
        let ws = self.storage.store.workspace(&req.sandbox_id);
        let max = match req.max_bytes {
            0 => DEFAULT_READ_BYTES,
            n => n.min(MAX_FILE_BYTES),
        };
        tokio::task::spawn_blocking(move || {
            let file = open_in(&ws, &req.path, OFlags::RDONLY | OFlags::NONBLOCK, 0)?;
            let meta = file
                .metadata()
                .map_err(|e| ProvisionerError::internal("stat", e))?;
            if !meta.is_file() {
                return Err(ProvisionerError::invalid("path", "is not a regular file"));
            }
            let mut content = Vec::new();
            file.take(max)
                .read_to_end(&mut content)
                .map_err(|e| ProvisionerError::internal("read", e))?;
            Ok(ReadFileResponse {
                truncated: meta.len() > content.len() as u64,
                size: meta.len(),
                content,
            })
        })
        .await
        .map_err(|e| ProvisionerError::internal("read file", e))?
    }

    pub async fn write_file(&self, req: WriteFileRequest) -> Result<WriteFileResponse> {
        let entry = self.entry(&req.sandbox_id)?;
        if entry.record().over_limit() {
            return Err(ProvisionerError::FailedPrecondition(
                "workspace is over its disk limit".into(),
            ));
        }
        if req.content.len() as u64 > MAX_FILE_BYTES {
            return Err(ProvisionerError::invalid("content", "larger than 64 MiB"));
        }
        let ws = self.storage.store.workspace(&req.sandbox_id);
        let uid = self.uid_of(&entry.record());
        let mode = if req.mode == 0 {
            0o644
        } else {
            req.mode & 0o777
        };
        tokio::task::spawn_blocking(move || {
            // Never blocking in open (a FIFO the agent made would hold this thread until a
            // reader came), and never anything but a regular file.
            let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::NOFOLLOW | OFlags::NONBLOCK;
            let mut file = open_in(&ws, &req.path, flags, mode)?;
            let meta = file
                .metadata()
                .map_err(|e| ProvisionerError::internal("stat", e))?;
            if !meta.is_file() {
                return Err(ProvisionerError::invalid("path", "is not a regular file"));
            }
            // A git object file shared read-only with the template's other copies
            // (`template::copy`): the sandbox itself could not write it either.
            if uid.is_some() && is_shared(&meta) {
                return Err(ProvisionerError::FailedPrecondition(format!(
                    "cannot write {}: a git object file shared read-only between the sandboxes of this repository",
                    req.path
                )));
            }
            // A file this call made is the sandbox's, as if its own command had written it.
            if let Some(uid) = uid {
                uids::give_file(&file, uid).map_err(|e| ProvisionerError::internal("give the file to the sandbox", e))?;
            }
            file.set_len(0)
                .map_err(|e| ProvisionerError::internal("truncate", e))?;
            file.write_all(&req.content)
                .map_err(|e| ProvisionerError::internal("write", e))?;
            Ok(WriteFileResponse {
                bytes_written: req.content.len() as u64,
            })
        })
        .await
        .map_err(|e| ProvisionerError::internal("write file", e))?
    }
}
