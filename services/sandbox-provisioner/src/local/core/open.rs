//! Start-up of the local backend: every setting checked against the host (bubblewrap,
//! user namespaces, cgroups, the forwarder, the stores), then the sandboxes a previous
//! run left taken over, and the reaper and the usage sampler started.

use crate::local::{
    base::{fs::find_executable, keyed_lock::KeyedLock, state_lock::StateLock},
    core::{config::Config, provisioner::Provisioner, reaper, usage},
    isolation::{
        Isolation,
        bubblewrap::{bwrap::Features, probe, seccomp},
        cgroup::{self, Cgroups},
        command::terminal::Ptys,
        gvisor::Gvisor,
        host_tools::{self, Toolchain},
        network::forwarder_kit::ForwarderKit,
        open_files,
        runtime_probe::RuntimeProbe,
        uids::{self, SandboxUids},
    },
    storage::{
        Storage,
        disk_quota::DiskQuota,
        image::{ImageCache, registry::Registries},
        overlay,
        snapshot::Snapshots,
        store::Store,
        template::{Templates, WarmBounds},
    },
};
use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    sync::{Arc, Mutex, atomic::AtomicBool},
};
use tracing::{info, warn};

/// How long a start waits for the previous provisioner on its state directory to go.
const STATE_LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

impl Provisioner {
    /// Check bubblewrap and cgroups work, then take over the sandboxes a previous run
    /// left (see `local::core::reaper`). Errors are configuration errors naming the setting.
    pub async fn open(config: Config) -> Result<Arc<Self>, String> {
        let bwrap = find_executable(&config.bwrap_path).ok_or_else(|| {
            format!(
                "--bwrap-path (FORKYARD_BWRAP_PATH) {}: no such executable",
                config.bwrap_path.display()
            )
        })?;
        open_files::raise();
        // The lock first: a start that is to be refused must not touch the directory.
        std::fs::create_dir_all(&config.state_dir).map_err(|e| state_dir_error(&config, e))?;
        let state_lock = StateLock::acquire(&config.state_dir, STATE_LOCK_WAIT)
            .await
            .map_err(|e| state_dir_error(&config, e))?;
        let store = Store::open(&config.state_dir).map_err(|e| state_dir_error(&config, e))?;
        let disk_quota = DiskQuota::detect(config.disk_quota, store.root(), &config.btrfs_path)?;
        let isolation = open_isolation(&config, bwrap, &store).await?;
        let storage = open_storage(&config, store, disk_quota, isolation.uids.as_ref())?;
        let records = storage
            .store
            .load_all()
            .map_err(|e| state_dir_error(&config, e))?;
        let isolation = Isolation {
            seccomp: seccomp_filters(&config)?,
            ..isolation
        };
        let core = Arc::new(Self {
            _state_lock: state_lock,
            ptys: Ptys::default(),
            config,
            storage,
            isolation,
            sandboxes: Mutex::new(HashMap::new()),
            creating: KeyedLock::default(),
            draining: AtomicBool::new(false),
            release_cgroups_on_drop: AtomicBool::new(true),
        });
        core.reconcile(records).await;
        core.log_ready();
        reaper::spawn(&core);
        usage::spawn_sampler(&core);
        Ok(core)
    }

    fn log_ready(&self) {
        info!(
            sandboxes = self.sandboxes.lock().expect("sandboxes lock").len(),
            features = ?self.isolation.features,
            cgroups = ?self.isolation.cgroups.as_ref().map(|c| c.version),
            disk_quota = self.storage.disk_quota.is_some(),
            overlay_workspaces = self.storage.overlay_workspaces,
            "sandbox provisioner ready"
        );
    }
}

/// What sandboxes will run in: their uids, what bubblewrap can do here, their cgroups
/// and the relays' forwarder (the seccomp filters are compiled last, at `open`).
async fn open_isolation(
    config: &Config,
    bwrap: PathBuf,
    store: &Store,
) -> Result<Isolation, String> {
    let uids = SandboxUids::new(config.sandbox_uid_base, config.sandbox_uid_count).map(Arc::new);
    let features = probe_bwrap(config, &bwrap, store, uids.is_some()).await?;
    let cgroups = detect_cgroups(config)?;
    let forwarder = forwarder_kit(config)?;
    let own_uids = uids.is_some();
    let agent_tools = config
        .agent_tools
        .as_deref()
        .map(|t| {
            host_tools::reachable(t, &config.state_dir.join("agent-tools"), own_uids)
                .map_err(|e| format!("--agent-tools (FORKYARD_AGENT_TOOLS) {}: {e}", t.display()))
        })
        .transpose()?;
    let toolchains = config
        .toolchains
        .iter()
        .map(|t| {
            let mirror = config.state_dir.join("toolchains").join(&t.name);
            let dir = host_tools::reachable(&t.dir, &mirror, own_uids).map_err(|e| {
                format!(
                    "--toolchains (FORKYARD_TOOLCHAINS) {}: {e}",
                    t.dir.display()
                )
            })?;
            Ok(Toolchain {
                name: t.name.clone(),
                dir,
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    Ok(Isolation {
        bwrap,
        features,
        cgroups,
        forwarder,
        uids,
        agent_tools,
        toolchains,
        seccomp: Vec::new(),
        runtime_probe: RuntimeProbe::default(),
        gvisor: Gvisor::new(
            &config.runsc_path,
            config.runsc_platform.clone(),
            config.state_dir.join("gvisor-probe"),
        ),
    })
}

/// What sandboxes keep on disk beside the store: snapshots, templates (overlaid where
/// overlays work here, warm where no quota makes each sandbox a subvolume) and images.
fn open_storage(
    config: &Config,
    store: Store,
    disk_quota: Option<DiskQuota>,
    uids: Option<&Arc<SandboxUids>>,
) -> Result<Storage, String> {
    let snapshots = Snapshots::open(&config.snapshot_dir).map_err(|e| {
        format!(
            "--snapshot-dir (FORKYARD_SNAPSHOT_DIR) {}: {e}",
            config.snapshot_dir.display()
        )
    })?;
    let overlay_workspaces = probe_overlay(config, uids.map(Arc::as_ref));
    let templates = open_templates(
        config,
        &store,
        disk_quota.is_some(),
        uids,
        overlay_workspaces,
    )?;
    let images = ImageCache::open(&config.image_cache_dir)
        .map(|c| Arc::new(c.with_limits(config.image_limits)))
        .map_err(|e| {
            format!(
                "--image-cache-dir (FORKYARD_IMAGE_CACHE_DIR) {}: {e}",
                config.image_cache_dir.display()
            )
        })?;
    let registries = Registries::new(&config.registry, config.image_cache_max_bytes)
        .map_err(|e| format!("--registry-auth-file (FORKYARD_REGISTRY_AUTH_FILE): {e}"))?;
    Ok(Storage {
        store,
        snapshots,
        templates,
        images,
        registries,
        disk_quota,
        overlay_workspaces,
    })
}

/// The workspace templates, with their warm copies and overlays.
fn open_templates(
    config: &Config,
    store: &Store,
    quota: bool,
    uids: Option<&Arc<SandboxUids>>,
    overlay_workspaces: bool,
) -> Result<Templates, String> {
    let warm = config.warm.resolved(overlay_workspaces);
    let templates = Templates::open(
        config.state_dir.join("templates"),
        config.template_cache_max_bytes,
    )
    .map_err(|e| state_dir_error(config, e))?
    // A sandbox with a hard quota is a subvolume of its own: nothing renames into it.
    .with_warm(if quota { WarmBounds::OFF } else { warm }, uids.cloned())
    .with_overlays(store.overlays().clone(), overlay_workspaces);
    Ok(templates)
}

fn state_dir_error(config: &Config, e: impl std::fmt::Display) -> String {
    format!(
        "--state-dir (FORKYARD_STATE_DIR) {}: {e}",
        config.state_dir.display()
    )
}

/// Whether new workspaces are overlays of their templates (`crate::local::storage::overlay`):
/// asked for, with a uid per sandbox, and working on this kernel (tried with one of the
/// replica's uids). Otherwise templates are copied, as before, and the log says why.
fn probe_overlay(config: &Config, uids: Option<&SandboxUids>) -> bool {
    if !config.workspace_overlay {
        return false;
    }
    let Some(uids) = uids else {
        info!(
            "workspace overlays need a uid per sandbox (the provisioner run as root); templates are copied"
        );
        return false;
    };
    let Ok(uid) = uids.claim() else {
        return false;
    };
    let tried = overlay::probe(&config.state_dir.join("overlay-probe"), uid);
    uids.release(uid);
    match tried {
        Ok(()) => true,
        Err(reason) => {
            warn!(%reason, "workspace overlays do not work here (they need Linux 6.15 or later); templates are copied");
            false
        }
    }
}

/// What bubblewrap can do here, tried as the sandboxes will run it (as their own uid
/// when `own_uids`); without a user namespace only where the operator allows it.
async fn probe_bwrap(
    config: &Config,
    bwrap: &Path,
    store: &Store,
    own_uids: bool,
) -> Result<Features, String> {
    let features = if own_uids {
        // Bubblewrap, run as a sandbox's uid, opens the workspace by path.
        for dir in [config.state_dir.as_path(), store.root()] {
            uids::let_through(dir)
                .map_err(|e| format!("--state-dir (FORKYARD_STATE_DIR) {}: {e}", dir.display()))?;
        }
        probe::probe(bwrap, store.root(), Some(config.sandbox_uid_base))
            .await
            .map_err(|e| {
                format!(
                    "--sandbox-uid-base (FORKYARD_SANDBOX_UID_BASE): sandboxes cannot run as host uid {}: {e} (every directory above {} must let others through, o+x; 0 runs sandboxes as root)",
                    config.sandbox_uid_base,
                    store.root().display(),
                )
            })?
    } else {
        probe::probe(bwrap, store.root(), None)
            .await
            .map_err(|e| format!("--bwrap-path (FORKYARD_BWRAP_PATH): {e}"))?
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
    Ok(features)
}

/// The sandboxes' cgroups; without them (disabled, or not usable and not required)
/// sandboxes run without limits.
fn detect_cgroups(config: &Config) -> Result<Option<Cgroups>, String> {
    let Some(parent) = &config.cgroup_parent else {
        warn!("cgroups disabled: sandboxes have no memory, pids or CPU limits");
        return Ok(None);
    };
    match Cgroups::detect(&cgroup::instance_parent(parent, &config.state_dir)) {
        Ok(cg) => Ok(Some(cg)),
        Err(e) if config.require_cgroups => {
            Err(format!("--require-cgroups (FORKYARD_REQUIRE_CGROUPS): {e}"))
        }
        Err(e) => {
            warn!(error = %e, "DEGRADED: cgroups unavailable; sandboxes run without memory, pids or CPU limits and destroy relies on pid namespaces");
            Ok(None)
        }
    }
}

/// The egress forwarder as sandboxes run it, when there is one. Sandboxes run a kit of
/// the forwarder, its loader and its libraries under the state directory: it runs on
/// any image, and a sandbox's bubblewrap (run as the sandbox's uid) reaches it whatever
/// the install path's parents allow.
fn forwarder_kit(config: &Config) -> Result<Option<ForwarderKit>, String> {
    if let Some(fwd) = &config.forwarder_path
        && find_executable(fwd).is_none()
    {
        return Err(format!(
            "--egress-forwarder (FORKYARD_EGRESS_FORWARDER) {}: no such executable",
            fwd.display()
        ));
    }
    let Some(fwd) = config.forwarder_path.as_deref().and_then(find_executable) else {
        return Ok(None);
    };
    ForwarderKit::prepare(&fwd, &config.state_dir.join("bin/forwarder"))
        .map(Some)
        .map_err(|e| {
            format!(
                "--egress-forwarder (FORKYARD_EGRESS_FORWARDER) {}: {e}",
                fwd.display()
            )
        })
}

fn seccomp_filters(config: &Config) -> Result<Vec<Vec<u8>>, String> {
    if config.seccomp {
        seccomp::filters().map_err(|e| format!("FORKYARD_SANDBOX_SECCOMP: {e}"))
    } else {
        warn!("sandboxes run without a seccomp filter (FORKYARD_SANDBOX_SECCOMP=false)");
        Ok(Vec::new())
    }
}
