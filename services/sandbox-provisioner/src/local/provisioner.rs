//! The core: sandbox lifecycle on the `local` (bubblewrap) backend. The gRPC service and
//! the Temporal activities are thin front doors over [`Provisioner`].

use crate::{
    error::{ProvisionerError, Result},
    limits::{STATE_SELECTOR, wanted_states},
    local::{
        bwrap::{self, Features},
        cgroup::{Cgroups, Limits},
        egress::{self, Allowlist},
        entry::Entry,
        snapshot::Snapshots,
        store::{self, Record, Store},
    },
};
use forkyard_proto::sandbox::v1::{CreateSandboxRequest, Sandbox, SandboxState};
use std::{
    collections::HashMap,
    path::PathBuf,
    sync::{Arc, Mutex},
    time::Duration,
};
use tracing::{info, warn};

pub const BACKEND: &str = "local";

/// Settings of the core (the binary fills them from flags; tests build them directly).
#[derive(Debug, Clone)]
pub struct Config {
    /// `<state>/sandboxes/<id>/` holds each sandbox.
    pub state_dir: PathBuf,
    /// The bubblewrap binary: a path or a name looked up on `$PATH`.
    pub bwrap_path: PathBuf,
    /// This replica's gRPC endpoint, stored as each sandbox's `owner_endpoint`.
    pub advertise_endpoint: String,
    /// This replica's own Temporal task queue, stored as each sandbox's
    /// `owner_task_queue` (empty = none: activities use the shared queue).
    pub owner_task_queue: String,
    /// Exec wall-clock limit when a request gives none.
    pub exec_timeout: Duration,
    /// Limit for cloning the repository.
    pub clone_timeout: Duration,
    /// Run sandboxes without a user namespace when the host cannot create one
    /// (otherwise the provisioner refuses to start).
    pub allow_no_userns: bool,
    /// Run as root: each sandbox gets a host uid of its own from `base..base + count`
    /// (`crate::local::uids`); base 0 runs sandboxes as the provisioner's uid.
    pub sandbox_uid_base: u32,
    pub sandbox_uid_count: u32,
    /// Name of the cgroup (under each hierarchy's root) holding the sandboxes' groups;
    /// `None` disables cgroups (no limits, destroy by pid namespace only).
    pub cgroup_parent: Option<String>,
    /// Refuse to start when cgroups cannot be used (otherwise: a warning, degraded mode).
    pub require_cgroups: bool,
    /// Limits for a sandbox whose request gives none (0 = unlimited).
    pub default_limits: Limits,
    /// Workspace bound for a sandbox whose request gives none (0 = unbounded).
    pub default_disk_bytes: u64,
    /// Whether a sandbox's disk bound is also a hard quota (`crate::local::disk_quota`).
    pub disk_quota: crate::local::disk_quota::QuotaMode,
    /// The btrfs tool, for subvolume quotas: a path or a name looked up on `$PATH`.
    pub btrfs_path: PathBuf,
    /// Lifetime of a sandbox whose request gives none (`ZERO` = no TTL).
    pub default_ttl: Duration,
    /// How often expired sandboxes are looked for.
    pub reap_interval: Duration,
    /// The `sandbox-egress-forwarder` binary; `None` = egress cannot be offered.
    pub forwarder_path: Option<PathBuf>,
    /// Each sandbox's commands run under one long-lived bubblewrap (`crate::local::init`), when
    /// there is a forwarder (the init is that binary).
    pub sandbox_init: bool,
    /// Compressed workspace snapshots (`<state>/snapshots` by default).
    pub snapshot_dir: PathBuf,
    /// Image archives a create may name as `archive:<name>`; `None`: none offered.
    pub image_archive_dir: Option<PathBuf>,
    /// Unpacked images, one per digest (`<state>/images` by default).
    pub image_cache_dir: PathBuf,
    /// Credentials and plain-HTTP registries for image pulls.
    pub registry: crate::local::image::registry::RegistryConfig,
    /// The image cache's size bound in bytes (0: none): least recently used images
    /// that no sandbox runs on are removed past it.
    pub image_cache_max_bytes: u64,
    /// The workspace templates' size bound in bytes (0: none).
    pub template_cache_max_bytes: u64,
    /// What sandboxes' CPU, memory and wall time cost.
    pub prices: crate::usage::Prices,
    /// Sandboxed commands run under the seccomp filters of `crate::local::seccomp`.
    pub seccomp: bool,
    /// Loopback, link-local or private addresses an `egress_allow` list may name (the
    /// operator's choice); any other is refused, so no sandbox reaches the host's or the
    /// mesh's own services.
    pub egress_private_allowed: Vec<std::net::IpAddr>,
}

impl Config {
    pub fn new(state_dir: impl Into<PathBuf>, advertise_endpoint: impl Into<String>) -> Self {
        let state_dir: PathBuf = state_dir.into();
        Self {
            snapshot_dir: state_dir.join("snapshots"),
            image_archive_dir: None,
            image_cache_dir: state_dir.join("images"),
            registry: crate::local::image::registry::RegistryConfig::default(),
            image_cache_max_bytes: 20 << 30,
            template_cache_max_bytes: 10 << 30,
            state_dir,
            bwrap_path: "bwrap".into(),
            advertise_endpoint: advertise_endpoint.into(),
            owner_task_queue: String::new(),
            exec_timeout: Duration::from_secs(600),
            clone_timeout: Duration::from_secs(300),
            allow_no_userns: false,
            sandbox_uid_base: crate::local::uids::DEFAULT_BASE,
            sandbox_uid_count: crate::local::uids::DEFAULT_COUNT,
            cgroup_parent: Some("forkyard".into()),
            require_cgroups: false,
            default_limits: Limits {
                memory_bytes: 4 << 30,
                pids: 1024,
                cpu_millis: 2000,
            },
            default_disk_bytes: 10 << 30,
            disk_quota: crate::local::disk_quota::QuotaMode::Auto,
            btrfs_path: "btrfs".into(),
            default_ttl: Duration::from_secs(4 * 3600),
            reap_interval: Duration::from_secs(30),
            forwarder_path: None,
            sandbox_init: true,
            prices: crate::usage::Prices::default(),
            egress_private_allowed: Vec::new(),
            seccomp: true,
        }
    }
}

pub struct Provisioner {
    pub(crate) config: Config,
    pub(crate) bwrap: PathBuf,
    pub(crate) features: Features,
    pub(crate) store: Store,
    pub(crate) cgroups: Option<Cgroups>,
    pub(crate) snapshots: Snapshots,
    pub(crate) templates: crate::local::template::Templates,
    /// Sandbox images, unpacked once per digest (`crate::local::image`).
    pub(crate) images: Arc<crate::local::image::ImageCache>,
    pub(crate) registries: crate::local::image::registry::Registries,
    /// The egress forwarder as sandboxes run it; `None`: no relays can be offered.
    pub(crate) forwarder: Option<crate::local::forwarder_kit::ForwarderKit>,
    pub(crate) sandboxes: Mutex<HashMap<String, Arc<Entry>>>,
    /// Commands running on a pseudo-terminal, by pty id.
    pub(crate) ptys: crate::local::pty::Ptys,
    /// Host uids of sandboxes, when the provisioner runs as root (`crate::local::uids`).
    pub(crate) uids: Option<crate::local::uids::SandboxUids>,
    /// Hard disk quotas, where the state directory's filesystem offers them.
    pub(crate) disk_quota: Option<crate::local::disk_quota::DiskQuota>,
    /// One lock per idempotency key with a create in flight.
    pub(crate) creating: crate::local::keyed_lock::KeyedLock<String>,
    /// The replica-wide probe of the sandbox runtime behind health checks (`health.rs`).
    pub(crate) runtime_probe: crate::local::health::RuntimeProbe,
    /// The seccomp filters every sandboxed command runs under (`crate::local::seccomp`); empty
    /// when the operator turned them off.
    pub(crate) seccomp: Vec<Vec<u8>>,
    /// Shutting down: new sandboxes are refused (UNAVAILABLE, so callers retry on
    /// another replica) while the ones held are used to the end.
    draining: std::sync::atomic::AtomicBool,
}

impl Provisioner {
    /// Check bubblewrap and cgroups work, then take over the sandboxes a previous run
    /// left (see [`crate::local::reaper`]). Errors are configuration errors naming the setting.
    pub async fn open(config: Config) -> Result<Arc<Self>, String> {
        let bwrap = bwrap::resolve(&config.bwrap_path).ok_or_else(|| {
            format!(
                "--bwrap-path (FORKYARD_BWRAP_PATH) {}: no such executable",
                config.bwrap_path.display()
            )
        })?;
        let store = Store::open(&config.state_dir).map_err(|e| {
            format!(
                "--state-dir (FORKYARD_STATE_DIR) {}: {e}",
                config.state_dir.display()
            )
        })?;
        let disk_quota = crate::local::disk_quota::DiskQuota::detect(
            config.disk_quota,
            store.root(),
            &config.btrfs_path,
        )?;
        let uids =
            crate::local::uids::SandboxUids::new(config.sandbox_uid_base, config.sandbox_uid_count);
        let features = match &uids {
            None => bwrap::probe(&bwrap, store.root(), None)
                .await
                .map_err(|e| format!("--bwrap-path (FORKYARD_BWRAP_PATH): {e}"))?,
            Some(_) => {
                // Bubblewrap, run as a sandbox's uid, opens the workspace by path.
                for dir in [config.state_dir.as_path(), store.root()] {
                    crate::local::uids::let_through(dir).map_err(|e| {
                        format!("--state-dir (FORKYARD_STATE_DIR) {}: {e}", dir.display())
                    })?;
                }
                bwrap::probe(&bwrap, store.root(), Some(config.sandbox_uid_base))
                    .await
                    .map_err(|e| {
                        format!(
                            "--sandbox-uid-base (FORKYARD_SANDBOX_UID_BASE): sandboxes cannot run as host uid {}: {e} (every directory above {} must let others through, o+x; 0 runs sandboxes as root)",
                            config.sandbox_uid_base,
                            store.root().display(),
                        )
                    })?
            }
        };
        if !features.userns {
            if !config.allow_no_userns {
                return Err(format!(
                    "--allow-no-userns (FORKYARD_ALLOW_NO_USERNS): {} cannot create a user \
                     namespace on this host; refusing to run sandboxes without one",
                    bwrap.display()
                ));
            }
            warn!(bwrap = %bwrap.display(), "no user namespace available: sandboxes run without one (FORKYARD_ALLOW_NO_USERNS)");
        }
        let cgroups = match &config.cgroup_parent {
            None => {
                warn!("cgroups disabled: sandboxes have no memory, pids or CPU limits");
                None
            }
            Some(parent) => {
                match Cgroups::detect(&crate::local::cgroup::instance_parent(
                    parent,
                    &config.state_dir,
                )) {
                    Ok(cg) => Some(cg),
                    Err(e) if config.require_cgroups => {
                        return Err(format!("--require-cgroups (FORKYARD_REQUIRE_CGROUPS): {e}"));
                    }
                    Err(e) => {
                        warn!(error = %e, "DEGRADED: cgroups unavailable; sandboxes run without memory, pids or CPU limits and destroy relies on pid namespaces");
                        None
                    }
                }
            }
        };
        if let Some(fwd) = &config.forwarder_path
            && bwrap::resolve(fwd).is_none()
        {
            return Err(format!(
                "--egress-forwarder (FORKYARD_EGRESS_FORWARDER) {}: no such executable",
                fwd.display()
            ));
        }
        // Sandboxes run a kit of the forwarder, its loader and its libraries under the
        // state directory: it runs on any image, and a sandbox's bubblewrap (run as the
        // sandbox's uid) reaches it whatever the install path's parents allow.
        let forwarder = match config.forwarder_path.as_deref().and_then(bwrap::resolve) {
            None => None,
            Some(fwd) => Some(
                crate::local::forwarder_kit::ForwarderKit::prepare(
                    &fwd,
                    &config.state_dir.join("bin/forwarder"),
                )
                .map_err(|e| {
                    format!(
                        "--egress-forwarder (FORKYARD_EGRESS_FORWARDER) {}: {e}",
                        fwd.display()
                    )
                })?,
            ),
        };
        let snapshots = Snapshots::open(&config.snapshot_dir).map_err(|e| {
            format!(
                "--snapshot-dir (FORKYARD_SNAPSHOT_DIR) {}: {e}",
                config.snapshot_dir.display()
            )
        })?;
        let templates = crate::local::template::Templates::open(
            config.state_dir.join("templates"),
            config.template_cache_max_bytes,
        )
        .map_err(|e| {
            format!(
                "--state-dir (FORKYARD_STATE_DIR) {}: {e}",
                config.state_dir.display()
            )
        })?;
        let images = crate::local::image::ImageCache::open(&config.image_cache_dir)
            .map(Arc::new)
            .map_err(|e| {
                format!(
                    "--image-cache-dir (FORKYARD_IMAGE_CACHE_DIR) {}: {e}",
                    config.image_cache_dir.display()
                )
            })?;
        let registries = crate::local::image::registry::Registries::new(
            &config.registry,
            config.image_cache_max_bytes,
        )
        .map_err(|e| format!("--registry-auth-file (FORKYARD_REGISTRY_AUTH_FILE): {e}"))?;
        let records = store.load_all().map_err(|e| {
            format!(
                "--state-dir (FORKYARD_STATE_DIR) {}: {e}",
                config.state_dir.display()
            )
        })?;
        let seccomp = if config.seccomp {
            crate::local::seccomp::filters()
                .map_err(|e| format!("FORKYARD_SANDBOX_SECCOMP: {e}"))?
        } else {
            tracing::warn!(
                "sandboxes run without a seccomp filter (FORKYARD_SANDBOX_SECCOMP=false)"
            );
            Vec::new()
        };
        let core = Arc::new(Self {
            seccomp,
            ptys: crate::local::pty::Ptys::default(),
            config,
            bwrap,
            features,
            store,
            cgroups,
            snapshots,
            templates,
            images,
            registries,
            forwarder,
            sandboxes: Mutex::new(HashMap::new()),
            creating: crate::local::keyed_lock::KeyedLock::default(),
            uids,
            disk_quota,
            draining: std::sync::atomic::AtomicBool::new(false),
            runtime_probe: crate::local::health::RuntimeProbe::default(),
        });
        core.reconcile(records).await;
        info!(
            sandboxes = core.sandboxes.lock().expect("sandboxes lock").len(),
            ?features,
            cgroups = ?core.cgroups.as_ref().map(|c| c.version),
            disk_quota = core.disk_quota.is_some(),
            "sandbox provisioner ready"
        );
        crate::local::reaper::spawn(&core);
        crate::local::usage::spawn_sampler(&core);
        Ok(core)
    }

    /// Make the running side of a sandbox: its cgroups and its egress proxy.
    pub(crate) fn activate(&self, entry: &Arc<Entry>) -> Result<()> {
        let record = entry.record();
        if !record.egress_allow.is_empty() {
            let allow = Allowlist::parse(&record.egress_allow)
                .map_err(|e| ProvisionerError::invalid("egress_allow", e))?;
            let socket = self.store.egress_socket(&record.id);
            egress::spawn(&socket, allow, entry.cancel.child_token())
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
        let Some(cg) = &self.cgroups else {
            return Ok(());
        };
        if entry.cgroups_made() {
            return Ok(());
        }
        let record = entry.record();
        cg.create(&record.id, record.limits)
            .map_err(|e| ProvisionerError::internal("create cgroup", e))?;
        entry.set_cgroups_made();
        Ok(())
    }

    /// The host uid a sandbox's commands run as: its own when this replica hands uids
    /// out, else the provisioner's.
    pub(crate) fn uid_of(&self, record: &Record) -> Option<u32> {
        (self.uids.is_some() && record.uid != 0).then_some(record.uid)
    }

    /// Give a file the sandbox must use (a relay socket) to the sandbox's uid.
    pub(crate) fn give_to_sandbox(
        &self,
        record: &Record,
        path: &std::path::Path,
    ) -> std::io::Result<()> {
        match self.uid_of(record) {
            Some(uid) => crate::local::uids::chown(path, uid),
            None => Ok(()),
        }
    }

    /// A sandbox's directory: owner-only, so nothing an agent leaves in a workspace (a
    /// setuid file) is reachable by other users of the host; with uids of their own,
    /// others may pass through (the sandbox's bubblewrap opens the workspace as the
    /// sandbox's uid, and what the agent made is that uid's, not root's).
    pub(crate) fn sandbox_dir_mode(&self) -> u32 {
        if self.uids.is_some() { 0o711 } else { 0o700 }
    }

    pub(crate) fn release_uid(&self, uid: u32) {
        // 0 (none given) is never in use: releasing it is a no-op.
        if let Some(uids) = &self.uids {
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
            return Err(ProvisionerError::Unavailable(
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

/// Removes a half-created sandbox directory when dropped while armed.
pub(crate) struct DirCleanup(pub(crate) Option<PathBuf>);

impl Drop for DirCleanup {
    fn drop(&mut self) {
        if let Some(dir) = self.0.take() {
            let remove = move || {
                if let Err(e) = store::remove_all(&dir) {
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
