//! The local backend's core: the [`Provisioner`], what it holds, and what every part of
//! the backend asks of it (a sandbox by id, its uid, its cgroups; the list; draining).
//! Start-up is `open`; each call of the session API is an `impl Provisioner` in a file
//! of its own (`create`, `destroy`, `exec`, `pty`, `session`, ...), over this one.

use crate::{
    error::{ProvisionerError, Result},
    limits::{STATE_SELECTOR, wanted_states},
    local::{
        base::{fs::remove_all, keyed_lock::KeyedLock, state_lock::StateLock},
        core::{config::Config, entry::Entry},
        isolation::{
            Isolation,
            command::terminal::Ptys,
            network::egress::{self, Allowlist},
            uids,
        },
        storage::{Storage, layout::sandbox_dir_mode, repo::submodules::Reader, store::Record},
    },
};
use forkyard_proto::sandbox::v1::{CreateSandboxRequest, Sandbox, SandboxState};
use std::{
    collections::HashMap,
    path::PathBuf,
    sync::{Arc, Mutex},
};
use tracing::warn;

pub const BACKEND: &str = "local";

/// The `local` backend: its sandboxes, what they keep on disk (`storage`) and what they
/// run in (`isolation`).
pub struct Provisioner {
    pub(crate) config: Config,
    /// Records, workspaces, snapshots, images and disk quotas.
    pub(crate) storage: Storage,
    /// Bubblewrap, cgroups, uids, seccomp and the relays' forwarder.
    pub(crate) isolation: Isolation,
    pub(crate) sandboxes: Mutex<HashMap<String, Arc<Entry>>>,
    /// Commands running on a pseudo-terminal, by pty id.
    pub(crate) ptys: Ptys,
    /// One lock per idempotency key with a create in flight.
    pub(crate) creating: KeyedLock<String>,
    /// Shutting down: new sandboxes are refused (UNAVAILABLE, so callers retry on
    /// another replica) while the ones held are used to the end.
    pub(crate) draining: std::sync::atomic::AtomicBool,
    /// Dropped, remove every group of this instance (`Drop`); off in
    /// the service binary ([`Self::keep_cgroups_at_exit`]).
    pub(crate) release_cgroups_on_drop: std::sync::atomic::AtomicBool,
    /// This instance alone uses the state directory (and so the cgroup parent named for
    /// it) while it lives.
    pub(crate) _state_lock: StateLock,
}

impl Provisioner {
    /// Make the running side of a sandbox: its cgroups and its egress proxy.
    pub(crate) fn activate(&self, entry: &Arc<Entry>) -> Result<()> {
        let record = entry.record();
        if !record.egress_allow.is_empty() {
            let allow = Allowlist::parse(&record.egress_allow)
                .map_err(|e| ProvisionerError::invalid("egress_allow", e))?;
            let socket = self.storage.store.egress_socket(&record.id);
            let limits = self.config.egress;
            egress::spawn(&socket, allow, limits, entry.cancel.child_token())
                .and_then(|()| self.give_to_sandbox(&record, &socket))
                .map_err(|e| ProvisionerError::internal("start egress proxy", e))?;
        }
        Ok(())
    }

    /// The sandbox's cgroups with its limits, made before its first command runs (at
    /// most once; idempotent). Not at create: nothing runs in a sandbox before its first
    /// command, and a cgroup's CPU limit is the dearest part of a create (the kernel
    /// walks every task group on each `cpu.cfs_quota_us` / `cpu.max` write, about 15%
    /// of the provisioner's CPU in a wave of a hundred creates).
    pub(crate) fn ensure_cgroups(&self, entry: &Entry) -> Result<()> {
        let Some(cg) = &self.isolation.cgroups else {
            return Ok(());
        };
        if entry.cgroups_made() {
            return Ok(());
        }
        let record = entry.record();
        let mut limits = record.limits;
        if record.isolation == crate::local::isolation::Kind::Gvisor {
            // gVisor's kernel holds the sandbox's processes to `pids`; the host's
            // controllers bound its own tasks and memory too (`gvisor::host_pids`,
            // `gvisor::host_memory`).
            limits.pids = crate::local::isolation::gvisor::host_pids(limits.pids);
            limits.memory_bytes = crate::local::isolation::gvisor::host_memory(limits.memory_bytes);
        }
        cg.create(&record.id, limits)
            .map_err(|e| ProvisionerError::internal("create cgroup", e))?;
        entry.set_cgroups_made();
        Ok(())
    }

    /// The service binary: its groups outlive it (see `Drop`).
    pub fn keep_cgroups_at_exit(&self) {
        self.release_cgroups_on_drop
            .store(false, std::sync::atomic::Ordering::SeqCst);
    }

    /// The host uid a sandbox's commands run as: its own when this replica hands uids
    /// out, else the provisioner's.
    pub(crate) fn uid_of(&self, record: &Record) -> Option<u32> {
        (self.isolation.uids.is_some() && record.uid != 0).then_some(record.uid)
    }

    /// Give a file the sandbox must use (a relay socket) to the sandbox's uid.
    pub(crate) fn give_to_sandbox(
        &self,
        record: &Record,
        path: &std::path::Path,
    ) -> std::io::Result<()> {
        match self.uid_of(record) {
            Some(uid) => uids::chown(path, uid),
            None => Ok(()),
        }
    }

    /// A sandbox's directory: owner-only, so nothing an agent leaves in a workspace (a
    /// setuid file) is reachable by other users of the host; with uids of their own,
    /// others may pass through (the sandbox's bubblewrap opens the workspace as the
    /// sandbox's uid, and what the agent made is that uid's, not root's).
    pub(crate) fn sandbox_dir_mode(&self) -> u32 {
        sandbox_dir_mode(self.isolation.uids.is_some())
    }

    /// How host git reads remote repositories for `tenant`.
    pub(crate) fn reader<'a>(&'a self, tenant: &'a str) -> Reader<'a> {
        Reader {
            hosts: &self.config.git_hosts,
            credentials: &self.config.git_credentials,
            tenant,
        }
    }

    /// The files a sandbox's first process writes itself into to join its cgroups
    /// (`Cgroups::join_files`); none without cgroups.
    pub(crate) fn cgroup_joins(&self, id: &str) -> Vec<PathBuf> {
        self.isolation
            .cgroups
            .as_ref()
            .map(|cg| cg.join_files(id))
            .unwrap_or_default()
    }

    pub(crate) fn release_uid(&self, uid: u32) {
        // 0 (none given) is never in use: releasing it is a no-op.
        if let Some(uids) = &self.isolation.uids {
            uids.release(uid);
        }
    }

    pub(crate) fn entry(&self, id: &str) -> Result<Arc<Entry>> {
        self.sandboxes
            .lock()
            .expect("sandboxes lock")
            .get(id)
            .cloned()
            .ok_or_else(|| ProvisionerError::NotFound(id.to_owned()))
    }

    pub(crate) fn by_key(&self, key: &str) -> Option<Sandbox> {
        let map = self.sandboxes.lock().expect("sandboxes lock");
        map.values()
            .find(|e| e.record.lock().expect("record lock").idempotency_key == key)
            .map(|e| self.snapshot(e))
    }

    /// The sandbox as callers see it, with its use so far.
    pub(crate) fn snapshot(&self, entry: &Entry) -> Sandbox {
        let mut s = entry.snapshot();
        s.usage = Some(self.usage(entry));
        s
    }

    /// Refuse new sandboxes from now on; [`Self::drained`] waits for the ones held.
    pub fn start_draining(&self) {
        self.draining
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }

    pub(crate) fn refuse_if_draining(&self, req: &CreateSandboxRequest) -> Result<()> {
        let retry_of_a_create =
            !req.idempotency_key.is_empty() && self.by_key(&req.idempotency_key).is_some();
        if self.draining.load(std::sync::atomic::Ordering::SeqCst) && !retry_of_a_create {
            return Err(ProvisionerError::Draining(
                "this replica is shutting down: create the sandbox on another replica".into(),
            ));
        }
        Ok(())
    }

    /// Returns once this replica holds no running sandbox, or after `timeout` (logging what is
    /// left); progress is logged as sandboxes go.
    pub async fn drained(&self, timeout: std::time::Duration) {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut last = usize::MAX;
        loop {
            // Stopped sandboxes wait on disk for a StartSandbox: the next start has them.
            let held = self
                .sandboxes
                .lock()
                .expect("sandboxes lock")
                .values()
                .filter(|e| !e.record.lock().expect("record lock").stopped)
                .count();
            if held == 0 {
                tracing::info!("drained: no sandbox left");
                return;
            }
            if tokio::time::Instant::now() >= deadline {
                tracing::warn!(
                    sandboxes = held,
                    timeout_secs = timeout.as_secs(),
                    "drain timed out; the sandboxes left are taken over at the next start"
                );
                return;
            }
            if held != last {
                tracing::info!(
                    sandboxes = held,
                    "draining: waiting for the sandboxes held to be destroyed"
                );
                last = held;
            }
            tokio::time::sleep(std::time::Duration::from_millis(250)).await;
        }
    }

    /// This replica's gRPC endpoint, stored as each sandbox's `owner_endpoint`.
    pub fn advertise_endpoint(&self) -> &str {
        &self.config.advertise_endpoint
    }

    /// The task queue only this replica polls (empty when not configured).
    pub fn owner_task_queue(&self) -> &str {
        &self.config.owner_task_queue
    }

    pub fn get(&self, id: &str) -> Result<Sandbox> {
        Ok(self.snapshot(&*self.entry(id)?))
    }

    /// Sandboxes carrying every label of `selector`, oldest first. The reserved key
    /// [`STATE_SELECTOR`] filters by state ("ready", "stopped", "destroying", comma-separated).
    pub fn list(&self, selector: &HashMap<String, String>) -> Vec<Sandbox> {
        let states = wanted_states(selector);
        let mut out: Vec<Sandbox> = {
            let map = self.sandboxes.lock().expect("sandboxes lock");
            map.values().map(|e| self.snapshot(e)).collect()
        };
        out.retain(|s| {
            selector
                .iter()
                .all(|(k, v)| k == STATE_SELECTOR || s.labels.get(k) == Some(v))
                && (states.is_empty() || states.iter().any(|st| *st == state_name(s.state)))
        });
        out.sort_by(|a, b| (a.created_unix_ms, &a.id).cmp(&(b.created_unix_ms, &b.id)));
        out
    }
}

fn state_name(state: i32) -> &'static str {
    match SandboxState::try_from(state) {
        Ok(SandboxState::Ready) => "ready",
        Ok(SandboxState::Stopped) => "stopped",
        Ok(SandboxState::Destroying) => "destroying",
        _ => "unspecified",
    }
}

/// An in-process provisioner dropped (tests, benches, embedders): every group of its
/// sandboxes killed and removed, then its parent group. Its sandboxes stay on disk; a later
/// start adopts them and makes their groups again at their first command. Why: a group
/// left behind is never removed by anyone else (its parent is named for the state
/// directory, and a test's is a temp one), and the kernel walks every task group on each
/// CPU-limit write: a host that had collected 5,000 of them spent ~0.8 ms more of the
/// provisioner's CPU a fork. The service keeps its groups at exit
/// ([`Provisioner::keep_cgroups_at_exit`]): its next start on the same state directory
/// reconciles them, and a surviving sandbox's CPU counter goes on from where it was.
impl Drop for Provisioner {
    fn drop(&mut self) {
        if let Some(cg) = &self.isolation.cgroups
            && self
                .release_cgroups_on_drop
                .load(std::sync::atomic::Ordering::SeqCst)
        {
            cg.remove_all();
        }
    }
}

/// Removes a half-created sandbox directory when dropped while armed.
pub(crate) struct DirCleanup(pub(crate) Option<PathBuf>);

impl Drop for DirCleanup {
    fn drop(&mut self) {
        if let Some(dir) = self.0.take() {
            let remove = move || {
                if let Err(e) = remove_all(&dir) {
                    warn!(dir = %dir.display(), error = %e, "cannot remove half-created sandbox");
                }
            };
            match tokio::runtime::Handle::try_current() {
                Ok(rt) => drop(rt.spawn_blocking(remove)),
                Err(_) => remove(),
            }
        }
    }
}
