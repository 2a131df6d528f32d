//! The rest of the session API: stop/start, persist a workspace to the snapshot store,
//! hydrate a sandbox from a snapshot, and fork N sandboxes from one.

use crate::{
    error::{ProvisionerError, Result},
    limits::now_ms,
    local::{
        base::fs::remove_all,
        core::{
            entry::Entry,
            provisioner::{DirCleanup, Provisioner},
        },
        isolation::uids,
        storage::{
            layout::{UPPER, WORK},
            snapshot,
            snapshot::Snapshots,
            store,
            store::Store,
        },
    },
};
use forkyard_proto::sandbox::v1::{
    CreateSandboxRequest, DeleteSnapshotRequest, DeleteSnapshotResponse, ForkSandboxRequest,
    ForkSandboxResponse, HydrateWorkspaceRequest, ListSnapshotsRequest, ListSnapshotsResponse,
    PersistWorkspaceRequest, PersistWorkspaceResponse, Sandbox, SnapshotInfo, StartSandboxRequest,
    StopSandboxRequest,
};
use std::{path::Path, time::Duration};

const MAX_FORKS: u32 = 64;

impl Provisioner {
    pub async fn stop(&self, req: StopSandboxRequest) -> Result<Sandbox> {
        let entry = self.entry(&req.sandbox_id)?;
        let record = {
            let mut r = entry.record.lock().expect("record lock");
            r.stopped = true;
            r.clone()
        };
        self.storage.store.save(&record)?;
        entry.stop_execs();
        if let Some(cg) = self.isolation.cgroups.clone() {
            let id = req.sandbox_id.clone();
            let _ = tokio::task::spawn_blocking(move || cg.kill_all(&id)).await;
        }
        let mut execs = entry.execs.subscribe();
        let _ =
            tokio::time::timeout(Duration::from_secs(10), execs.wait_for(|s| s.running == 0)).await;
        Ok(self.snapshot(&entry))
    }

    pub async fn start(&self, req: StartSandboxRequest) -> Result<Sandbox> {
        let entry = self.entry(&req.sandbox_id)?;
        let record = {
            let mut r = entry.record.lock().expect("record lock");
            r.stopped = false;
            r.clone()
        };
        self.storage.store.save(&record)?;
        Ok(self.snapshot(&entry))
    }

    pub async fn persist(&self, req: PersistWorkspaceRequest) -> Result<PersistWorkspaceResponse> {
        let entry = self.entry(&req.sandbox_id)?;
        let record = entry.record();
        let ws = self.storage.store.workspace(&record.id);
        let snaps = self.storage.snapshots.clone();
        let meta = tokio::task::spawn_blocking(move || snaps.persist(&ws, &record, now_ms()))
            .await
            .map_err(|e| ProvisionerError::internal("persist", e))??;
        tracing::info!(sandbox_id = %req.sandbox_id, snapshot_id = %meta.id, bytes = meta.bytes, "workspace persisted");
        Ok(PersistWorkspaceResponse {
            snapshot_id: meta.id,
            bytes: meta.bytes,
        })
    }

    /// Remove a snapshot (a run's branch points go with the run); one already gone is
    /// `existed = false`.
    pub async fn delete_snapshot(
        &self,
        req: DeleteSnapshotRequest,
    ) -> Result<DeleteSnapshotResponse> {
        let snaps = self.storage.snapshots.clone();
        let id = req.snapshot_id.clone();
        let existed = tokio::task::spawn_blocking(move || snaps.delete(&id))
            .await
            .map_err(|e| ProvisionerError::internal("delete snapshot", e))??;
        if existed {
            tracing::info!(snapshot_id = %req.snapshot_id, "snapshot deleted");
        }
        Ok(DeleteSnapshotResponse { existed })
    }

    /// The snapshots carrying every label `req` names.
    pub async fn list_snapshots(&self, req: ListSnapshotsRequest) -> Result<ListSnapshotsResponse> {
        let snaps = self.storage.snapshots.clone();
        let all = tokio::task::spawn_blocking(move || snaps.list())
            .await
            .map_err(|e| ProvisionerError::internal("list snapshots", e))??;
        let snapshots = all
            .into_iter()
            .filter(|m| req.labels.iter().all(|(k, v)| m.labels.get(k) == Some(v)))
            .map(|m| SnapshotInfo {
                id: m.id,
                labels: m.labels,
                created_unix_ms: m.created_unix_ms,
                bytes: m.bytes,
                source_sandbox: m.source_sandbox,
            })
            .collect();
        Ok(ListSnapshotsResponse { snapshots })
    }

    /// Replace the workspace with the snapshot's; refused while commands run.
    pub async fn hydrate(&self, req: HydrateWorkspaceRequest) -> Result<Sandbox> {
        let entry = self.entry(&req.sandbox_id)?;
        let Some(_guard) = entry.begin_exec() else {
            return Err(ProvisionerError::FailedPrecondition(
                "sandbox is being destroyed".into(),
            ));
        };
        if entry.execs.borrow().running > 1 {
            return Err(ProvisionerError::FailedPrecondition(
                "commands are running in the sandbox; stop it first".into(),
            ));
        }
        // A snapshot that is not there is refused before anything of the sandbox goes.
        self.storage.snapshots.meta(&req.snapshot_id)?;
        // The sandbox's bubblewrap holds the old workspace's directory, not its path:
        // what is left in the sandbox goes with it, the next command starts a new one.
        // Everything it left running is killed and waited for before the old workspace
        // is removed: a live process could swap its directories under the removal.
        entry.end_init();
        if let Some(cg) = self.isolation.cgroups.clone() {
            let id = req.sandbox_id.clone();
            let _ = tokio::task::spawn_blocking(move || cg.kill_all(&id)).await;
        }
        // An overlay's mount goes (its processes are gone): the snapshot's workspace is
        // a plain directory, and the layers are removed once it is in place.
        let dir = self.storage.store.dir(&req.sandbox_id);
        let snaps = self.storage.snapshots.clone();
        let id = req.snapshot_id.clone();
        let uid = self.uid_of(&entry.record());
        let disk_bytes = entry.record().disk_bytes;
        let (store, held) = (self.storage.store.clone(), entry.clone());
        // On a blocking thread to the end, whether or not the caller waits: an overlay's
        // mount and record change with the workspace, never one without the other.
        tokio::task::spawn_blocking(move || {
            swap_with_overlay(&store, &held, &dir, &snaps, &id, uid, disk_bytes)
        })
        .await
        .map_err(|e| ProvisionerError::internal("hydrate", e))??;
        // An init a command started meanwhile holds the old workspace: it goes too.
        entry.end_init();
        Ok(self.snapshot(&entry))
    }

    /// A new sandbox whose workspace is snapshot `req.snapshot_id` (called by create).
    pub(crate) async fn create_from_snapshot(
        &self,
        mut req: CreateSandboxRequest,
        image: Option<store::SandboxImage>,
    ) -> Result<Sandbox> {
        let meta = self.storage.snapshots.meta(&req.snapshot_id)?;
        if req.repo.is_empty() {
            req.repo.clone_from(&meta.repo);
        }
        if req.branch.is_empty() {
            req.branch.clone_from(&meta.branch);
        }
        let id = format!("sbx-{}", uuid::Uuid::new_v4().simple());
        let dir = self.storage.store.dir(&id);
        self.make_sandbox_dir(&dir, &req).await?;
        let mut cleanup = DirCleanup(Some(dir));
        let snaps = self.storage.snapshots.clone();
        let ws = self.storage.store.workspace(&id);
        let snap = req.snapshot_id.clone();
        let disk_bytes = self.disk_bytes_for(&req);
        tokio::task::spawn_blocking(move || snaps.unpack(&snap, &ws, disk_bytes))
            .await
            .map_err(|e| ProvisionerError::internal("unpack", e))??;
        let record = self.new_record(&id, &req, meta.base_commit, image);
        let sandbox = self.register(record).await?;
        cleanup.0 = None;
        crate::metrics::workspace_made(crate::metrics::Workspace::Snapshot);
        Ok(sandbox)
    }

    pub async fn fork(
        self: &std::sync::Arc<Self>,
        req: ForkSandboxRequest,
    ) -> Result<ForkSandboxResponse> {
        if req.count == 0 || req.count > MAX_FORKS {
            return Err(ProvisionerError::invalid(
                "count",
                format!("must be 1..={MAX_FORKS}"),
            ));
        }
        let snapshot_id = match (req.snapshot_id.is_empty(), req.sandbox_id.is_empty()) {
            (false, true) => req.snapshot_id.clone(),
            (true, false) => {
                let p = PersistWorkspaceRequest {
                    sandbox_id: req.sandbox_id.clone(),
                };
                self.persist(p).await?.snapshot_id
            }
            _ => {
                return Err(ProvisionerError::invalid(
                    "snapshot_id",
                    "give exactly one of snapshot_id and sandbox_id",
                ));
            }
        };
        let template = req.template.unwrap_or_default();
        let mut sandboxes = Vec::new();
        for i in 0..req.count {
            let mut r = template.clone();
            r.snapshot_id.clone_from(&snapshot_id);
            r.labels.insert("forkyard.fork_index".into(), i.to_string());
            if !r.idempotency_key.is_empty() {
                r.idempotency_key = format!("{}/{i}", r.idempotency_key);
            }
            sandboxes.push(self.create(r).await?);
        }
        Ok(ForkSandboxResponse {
            snapshot_id,
            sandboxes,
        })
    }
}

/// [`swap_in_snapshot`], with an overlay workspace's mount and record changed with the
/// workspace, never one without the other: the mount goes first, is mounted again if the
/// swap fails, and its layers go once the snapshot's workspace is in place.
fn swap_with_overlay(
    store: &Store,
    held: &Entry,
    dir: &Path,
    snaps: &Snapshots,
    id: &str,
    uid: Option<u32>,
    disk_bytes: u64,
) -> Result<()> {
    let overlay = held.record().overlay;
    if overlay.is_some() {
        store.overlays().remove(&held.record().id);
    }
    let swapped = swap_in_snapshot(dir, snaps, id, uid, disk_bytes);
    match (&overlay, &swapped) {
        (None, _) => {}
        (Some(lower), Err(_)) => {
            let record = held.record();
            if let Err(e) = store.overlays().mount(&record.id, lower, dir, record.uid) {
                tracing::error!(sandbox_id = %record.id, error = %e, "cannot mount the overlay workspace again after a failed hydrate");
            }
        }
        (Some(_), Ok(())) => {
            let record = {
                let mut r = held.record.lock().expect("record lock");
                r.overlay = None;
                r.clone()
            };
            store.save(&record)?;
            for layer in [UPPER, WORK] {
                let _ = remove_all(&dir.join(layer));
            }
        }
    }
    swapped
}

/// Snapshot `id` unpacked beside `dir`'s workspace, given to `uid`, and swapped in.
fn swap_in_snapshot(
    dir: &std::path::Path,
    snaps: &snapshot::Snapshots,
    id: &str,
    uid: Option<u32>,
    disk_bytes: u64,
) -> Result<()> {
    let fresh = dir.join("workspace.hydrating");
    let old = dir.join("workspace.old");
    let _ = remove_all(&fresh);
    snaps.unpack(id, &fresh, disk_bytes)?;
    if let Some(uid) = uid
        && let Err(e) = uids::give_workspace(&fresh, uid)
    {
        let _ = remove_all(&fresh);
        return Err(ProvisionerError::internal(
            "give the workspace to its uid",
            e,
        ));
    }
    let ws = dir.join("workspace");
    std::fs::rename(&ws, &old)
        .and_then(|()| std::fs::rename(&fresh, &ws))
        .map_err(|e| ProvisionerError::internal("swap workspace", e))?;
    let _ = remove_all(&old);
    Ok(())
}
