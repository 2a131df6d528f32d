//! Sandbox records on disk: `<state>/sandboxes/<id>/sandbox.json` beside the
//! `workspace/` clone. A record is written last (atomically) when a sandbox is created,
//! so a directory without a readable record is an interrupted create.

use crate::{
    error::{ProvisionerError, Result},
    local::{
        base::fs::{remove_all, write_in_place},
        isolation::cgroup::Limits,
        storage::{
            layout::{RECORD, UPPER, WORKSPACE},
            overlay,
        },
    },
};
use forkyard_proto::sandbox::v1::{Sandbox, SandboxLimits, SandboxState};
use serde::{Deserialize, Serialize};
use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    sync::{OnceLock, mpsc::Sender},
};

pub use crate::local::storage::disk_usage::{disk_usage, disk_usage_over, workspace_usage};

/// Everything the provisioner remembers about one sandbox.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Record {
    pub id: String,
    pub backend: String,
    pub destroying: bool,
    pub labels: HashMap<String, String>,
    pub branch: String,
    pub base_commit: String,
    pub created_unix_ms: i64,
    pub owner_endpoint: String,
    /// This replica's own Temporal task queue (empty in records from before it existed).
    #[serde(default)]
    pub owner_task_queue: String,
    pub idempotency_key: String,
    pub network: bool,
    pub repo: String,
    pub base_ref: String,
    #[serde(default)]
    pub limits: Limits,
    /// Workspace bound in bytes; 0 = none.
    #[serde(default)]
    pub disk_bytes: u64,
    #[serde(default)]
    pub egress_allow: Vec<String>,
    /// 0 = never expires.
    #[serde(default)]
    pub expires_unix_ms: i64,
    #[serde(default)]
    pub stopped: bool,
    /// Size of the workspace at the last check (not authoritative on disk).
    #[serde(default)]
    pub workspace_bytes: u64,
    /// Memory held while commands ran, MiB × milliseconds (sampled; see crate::usage).
    #[serde(default)]
    pub memory_mib_ms: u64,
    /// The host uid the sandbox runs as and its workspace is owned by (`crate::local::isolation::uids`);
    /// 0: the provisioner's own.
    #[serde(default)]
    pub uid: u32,
    /// The image the sandbox runs on; `None`: the host's /usr.
    #[serde(default)]
    pub image: Option<SandboxImage>,
    /// The checksum (hex) of the git index the workspace was made with, a checkout of
    /// `base_commit` (a template's copy, or a clone); empty for a sandbox made from a
    /// snapshot. An index with this checksum holds the base's tree whatever happened to
    /// the workspace since (a hydrate keeps it), so a workspace whose files are all as
    /// that index records them has no patch to collect (`crate::local::storage::repo::patch_scan`).
    #[serde(default)]
    pub made_index: String,
    /// The workspace is an overlay of this template workspace (`crate::local::storage::overlay`),
    /// the sandbox's own files in `upper/`; `None`: a plain directory at `workspace/`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overlay: Option<PathBuf>,
    /// What holds its commands (records from before there was a choice: bubblewrap).
    #[serde(default)]
    pub isolation: crate::local::isolation::Kind,
}

/// A sandbox's image, as resolved at create (`crate::local::storage::image`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct SandboxImage {
    /// As the create asked for it.
    pub reference: String,
    pub digest: String,
    /// The unpacked root filesystem in the image cache (read-only to sandboxes).
    pub rootfs: PathBuf,
    /// The image's `Env`, each `NAME=value` (checked: no NUL byte).
    pub env: Vec<(String, String)>,
}

impl Record {
    pub fn over_limit(&self) -> bool {
        self.disk_bytes > 0 && self.workspace_bytes > self.disk_bytes
    }

    pub fn to_proto(&self, running_execs: u32) -> Sandbox {
        let state = if self.destroying {
            SandboxState::Destroying
        } else if self.stopped {
            SandboxState::Stopped
        } else {
            SandboxState::Ready
        };
        Sandbox {
            id: self.id.clone(),
            backend: self.backend.clone(),
            state: state as i32,
            labels: self.labels.clone(),
            branch: self.branch.clone(),
            base_commit: self.base_commit.clone(),
            created_unix_ms: self.created_unix_ms,
            owner_endpoint: self.owner_endpoint.clone(),
            owner_task_queue: self.owner_task_queue.clone(),
            running_execs,
            expires_unix_ms: self.expires_unix_ms,
            limits: Some(SandboxLimits {
                memory_bytes: self.limits.memory_bytes,
                pids: u32::try_from(self.limits.pids).unwrap_or(u32::MAX),
                cpu_millis: u32::try_from(self.limits.cpu_millis).unwrap_or(u32::MAX),
                disk_bytes: self.disk_bytes,
            }),
            egress_allow: self.egress_allow.clone(),
            workspace_bytes: self.workspace_bytes,
            workspace_over_limit: self.over_limit(),
            // Live figures: filled in by the provisioner (crate::usage).
            usage: None,
            image: self
                .image
                .as_ref()
                .map(|i| i.reference.clone())
                .unwrap_or_default(),
            image_digest: self
                .image
                .as_ref()
                .map(|i| i.digest.clone())
                .unwrap_or_default(),
            isolation: self.isolation.as_str().to_owned(),
        }
    }
}

/// Where the host reaches a sandbox's workspace ([`Store::workspace`]). An overlay's is
/// a path through the provisioner's descriptor of its mount, held here: while this is
/// alive the number cannot be closed and reused (by another sandbox's mount).
#[derive(Debug, Clone)]
pub struct WorkspacePath {
    path: PathBuf,
    _mount: Option<std::sync::Arc<rustix::fd::OwnedFd>>,
}

impl std::ops::Deref for WorkspacePath {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.path
    }
}

impl AsRef<Path> for WorkspacePath {
    fn as_ref(&self) -> &Path {
        &self.path
    }
}

/// Where sandboxes live on disk.
#[derive(Clone)]
pub struct Store {
    root: PathBuf,
    /// `<state>/trash`: destroyed sandboxes' directories, removed in the background.
    trash: PathBuf,
    /// The live overlay workspaces' mounts.
    overlays: std::sync::Arc<overlay::Overlays>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("root", &self.root)
            .finish_non_exhaustive()
    }
}

impl Store {
    /// The store under `state_dir`, creating `sandboxes/` if needed.
    pub fn open(state_dir: &Path) -> std::io::Result<Self> {
        let root = state_dir.join("sandboxes");
        std::fs::create_dir_all(&root)?;
        // Owner-only, so nothing an agent leaves in a workspace (a setuid file) is
        // reachable by other users of the host.
        std::fs::set_permissions(&root, std::os::unix::fs::PermissionsExt::from_mode(0o700))?;
        spread_subdirectories(&root);
        let trash = state_dir.join("trash");
        std::fs::create_dir_all(&trash)?;
        std::fs::set_permissions(&trash, std::os::unix::fs::PermissionsExt::from_mode(0o700))?;
        // What a previous run had not finished removing.
        for e in std::fs::read_dir(&trash)?.flatten() {
            remove_in_background(e.path());
        }
        Ok(Self {
            root,
            trash,
            overlays: std::sync::Arc::default(),
        })
    }

    /// Take sandbox `id`'s directory away at once and delete it in the background: its
    /// processes are gone, and deleting thousands of files can take long (on hosts
    /// with online discard, ~3 ms a file). Removed in place if it cannot be moved.
    pub fn remove_later(&self, id: &str) -> std::io::Result<()> {
        self.overlays.remove(id);
        let dir = self.dir(id);
        let to = self
            .trash
            .join(format!("{id}-{}", uuid::Uuid::new_v4().simple()));
        match std::fs::rename(&dir, &to) {
            Ok(()) => {
                remove_in_background(to);
                Ok(())
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(_) => remove_all(&dir),
        }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn dir(&self, id: &str) -> PathBuf {
        self.root.join(id)
    }

    /// Where the host reads and writes sandbox `id`'s workspace: its directory, or the
    /// root of its overlay's mount (`crate::local::storage::overlay`).
    pub fn workspace(&self, id: &str) -> WorkspacePath {
        match self.overlays.path(id) {
            Some((path, mount)) => WorkspacePath {
                path,
                _mount: Some(mount),
            },
            None => WorkspacePath {
                path: self.mountpoint(id),
                _mount: None,
            },
        }
    }

    /// The workspace's directory: what bubblewrap binds at `/workspace` (an overlay is
    /// mounted on it in the sandbox's own mount namespace, never in the host's).
    pub fn mountpoint(&self, id: &str) -> PathBuf {
        self.dir(id).join(WORKSPACE)
    }

    /// What sandbox `record` wrote itself, as its disk bound counts it: its overlay's
    /// upper layer, or its whole workspace.
    pub fn own_files(&self, record: &Record) -> PathBuf {
        match record.overlay {
            Some(_) => self.dir(&record.id).join(UPPER),
            None => self.mountpoint(&record.id),
        }
    }

    pub(crate) fn overlays(&self) -> &std::sync::Arc<overlay::Overlays> {
        &self.overlays
    }

    /// The egress proxy's socket (outside the workspace: the agent cannot replace it).
    pub fn egress_socket(&self, id: &str) -> PathBuf {
        self.dir(id).join("egress.sock")
    }

    /// Write the record atomically (temp file + rename).
    /// Save a new sandbox's record: into the empty record file a warm copy comes with
    /// (no new file, see `template::warm`), else as [`Self::save`]. A crash mid-write
    /// leaves a record that does not parse, discarded at start-up with its directory, as
    /// a create that never finished.
    pub fn save_new(&self, record: &Record) -> Result<()> {
        let path = self.dir(&record.id).join(RECORD);
        match write_in_place(&path, &encode(record)?) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => self.save(record),
            done => done.map_err(|e| {
                ProvisionerError::internal(&format!("write record {}", path.display()), e)
            }),
        }
    }

    pub fn save(&self, record: &Record) -> Result<()> {
        let dir = self.dir(&record.id);
        let tmp = dir.join(format!("{RECORD}.tmp"));
        std::fs::write(&tmp, encode(record)?)
            .and_then(|()| std::fs::rename(&tmp, dir.join(RECORD)))
            .map_err(|e| ProvisionerError::internal(&format!("write record {}", tmp.display()), e))
    }

    /// Every complete record. Directories holding a half-written record or no workspace
    /// are removed and logged; records of sandboxes that were being destroyed are
    /// returned so the caller finishes the destroy.
    pub fn load_all(&self) -> std::io::Result<Vec<Record>> {
        let mut records = Vec::new();
        for entry in std::fs::read_dir(&self.root)? {
            let entry = entry?;
            let id = entry.file_name().to_string_lossy().into_owned();
            match self.load_one(&entry.path()) {
                Ok(record) if record.id == id => records.push(record),
                Ok(record) => {
                    self.discard(&id, &format!("record names another sandbox {}", record.id))
                }
                Err(reason) => self.discard(&id, &reason),
            }
        }
        Ok(records)
    }

    fn load_one(&self, dir: &Path) -> Result<Record, String> {
        if !dir.is_dir() {
            return Err("not a directory".into());
        }
        let raw =
            std::fs::read(dir.join(RECORD)).map_err(|e| format!("no readable record: {e}"))?;
        let record: Record =
            serde_json::from_slice(&raw).map_err(|e| format!("corrupt record: {e}"))?;
        match &record.overlay {
            Some(lower) => {
                if !dir.join(UPPER).is_dir() {
                    return Err("overlay workspace's upper directory missing".into());
                }
                if !lower.join(".git").is_dir() {
                    return Err(format!(
                        "overlay workspace's template {} missing",
                        lower.display()
                    ));
                }
            }
            None if !dir.join(WORKSPACE).join(".git").is_dir() => {
                return Err("workspace missing".into());
            }
            None => {}
        }
        Ok(record)
    }

    fn discard(&self, id: &str, reason: &str) {
        tracing::warn!(sandbox_id = %id, reason, "discarding incomplete sandbox found at start-up");
        if let Err(e) = remove_all(&self.dir(id)) {
            tracing::error!(sandbox_id = %id, error = %e, "cannot remove incomplete sandbox");
        }
    }
}

fn encode(record: &Record) -> Result<Vec<u8>> {
    serde_json::to_vec_pretty(record).map_err(|e| ProvisionerError::internal("encode record", e))
}

/// Mark `dir` as a top of directory hierarchies (`chattr +T`), so ext4 places each new
/// sandbox directory (and with it its files) in a block group of its own choosing, as
/// it does for directories under `/`, instead of packing every sandbox into the group
/// of `dir`. Why it matters: on ext4 without a journal a new inode skips every inode of
/// its group freed in the last minute or more, checking each; with all sandboxes in one
/// group, a wave's creates after a run's destroys spent most of the machine's CPU in
/// that scan (100 creates: created p50 300–500 ms, 60–90 ms with the flag). Spread
/// groups also mean parallel copies take different group locks. Filesystems without
/// the flag (tmpfs, XFS) just say so; nothing else changes.
pub(crate) fn spread_subdirectories(dir: &Path) {
    use rustix::fs::{IFlags, ioctl_getflags, ioctl_setflags};
    let set = std::fs::File::open(dir).and_then(|f| {
        let flags = ioctl_getflags(&f)?;
        if !flags.contains(IFlags::TOPDIR) {
            ioctl_setflags(&f, flags | IFlags::TOPDIR)?;
        }
        Ok(())
    });
    if let Err(e) = set {
        tracing::debug!(dir = %dir.display(), error = %e, "cannot mark the sandboxes directory as a top directory");
    }
}

/// Queue a directory for the one background remover thread. One, not a thread per
/// directory: a run's worth of destroys removed all at once contended with the next
/// wave's workspace copies for the filesystem (on a host mounted with `discard`, every
/// freed block is a device round trip), and creates slowed down for seconds.
fn remove_in_background(path: PathBuf) {
    static QUEUE: OnceLock<Option<Sender<PathBuf>>> = OnceLock::new();
    let queue = QUEUE.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::channel::<PathBuf>();
        std::thread::Builder::new()
            .name("trash-remover".into())
            .spawn(move || {
                for path in rx {
                    if let Err(e) = remove_all(&path) {
                        tracing::warn!(dir = %path.display(), error = %e, "cannot remove a destroyed sandbox's files");
                    }
                }
            })
            .inspect_err(|e| tracing::warn!(error = %e, "cannot start the trash remover thread; removing in place"))
            .ok()
            .map(|_| tx)
    });
    let unsent = match queue {
        Some(q) => q.send(path).err().map(|std::sync::mpsc::SendError(p)| p),
        None => Some(path),
    };
    if let Some(path) = unsent
        && let Err(e) = remove_all(&path)
    {
        tracing::warn!(dir = %path.display(), error = %e, "cannot remove a destroyed sandbox's files");
    }
}

#[cfg(test)]
#[path = "store_tests.rs"]
mod tests;
