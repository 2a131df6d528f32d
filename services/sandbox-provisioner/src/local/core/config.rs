//! The local backend's settings.

use crate::{
    local::{
        isolation::{cgroup::Limits, network::llm_relay::RelayLimits, uids},
        storage::{
            disk_quota::QuotaMode, image, image::registry::RegistryConfig, template::WarmBounds,
        },
    },
    usage::Prices,
};
use forkyard_common::allowed_hosts::AllowedHosts;
use std::{path::PathBuf, time::Duration};

/// The setting of the git hosts a create may make this replica reach, as errors name it.
pub const GIT_HOSTS_SETTING: &str = "--allowed-git-hosts (FORKYARD_ALLOWED_GIT_HOSTS)";

/// Settings of the core (the binary fills them from flags; tests build them directly).
#[derive(Debug, Clone)]
pub struct Config {
    /// `<state>/sandboxes/<id>/` holds each sandbox.
    pub state_dir: PathBuf,
    /// The bubblewrap binary: a path or a name looked up on `$PATH`.
    pub bwrap_path: PathBuf,
    /// gVisor's runsc, for sandboxes asking for `isolation: gvisor`: a path or a name
    /// looked up on `$PATH` (missing: such a create is refused, saying so).
    pub runsc_path: PathBuf,
    /// runsc's `--platform` (`None`: runsc's default).
    pub runsc_platform: Option<String>,
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
    /// (`crate::local::isolation::uids`); base 0 runs sandboxes as the provisioner's uid.
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
    /// Whether a sandbox's disk bound is also a hard quota (`crate::local::storage::disk_quota`).
    pub disk_quota: QuotaMode,
    /// The btrfs tool, for subvolume quotas: a path or a name looked up on `$PATH`.
    pub btrfs_path: PathBuf,
    /// Lifetime of a sandbox whose request gives none (`ZERO` = no TTL).
    pub default_ttl: Duration,
    /// The most memory, disk, processes and lifetime a create may ask for.
    pub maxima: crate::maxima::Maxima,
    /// What each sandbox's LLM relay holds its connections to.
    pub llm_relay: RelayLimits,
    /// Connections each sandbox's egress proxy holds at once.
    pub egress: forkyard_common::http_limits::Limits,
    /// How often expired sandboxes are looked for.
    pub reap_interval: Duration,
    /// The `sandbox-egress-forwarder` binary; `None` = egress cannot be offered.
    pub forwarder_path: Option<PathBuf>,
    /// Agent CLIs bound into every sandbox at [`crate::local::isolation::bubblewrap::bwrap::TOOLS`].
    pub agent_tools: Option<PathBuf>,
    /// Toolchains bound into every sandbox at `host_tools::TOOLCHAINS/<name>`.
    pub toolchains: Vec<crate::local::isolation::host_tools::Toolchain>,
    /// Each sandbox's commands run under one long-lived bubblewrap (`crate::local::isolation::init`), when
    /// there is a forwarder (the init is that binary).
    pub sandbox_init: bool,
    /// A template's sandbox gets an overlay of its workspace, not a copy, where the
    /// kernel allows (`crate::local::storage::overlay`).
    pub workspace_overlay: bool,
    /// Compressed workspace snapshots (`<state>/snapshots` by default).
    pub snapshot_dir: PathBuf,
    /// Image archives a create may name as `archive:<name>`; `None`: none offered.
    pub image_archive_dir: Option<PathBuf>,
    /// Unpacked images, one per digest (`<state>/images` by default).
    pub image_cache_dir: PathBuf,
    /// Credentials and plain-HTTP registries for image pulls.
    pub registry: RegistryConfig,
    /// The image cache's size bound in bytes (0: none): least recently used images
    /// that no sandbox runs on are removed past it.
    pub image_cache_max_bytes: u64,
    /// What one image may unpack to (bytes and entries); past it the image is refused.
    pub image_limits: image::UnpackLimits,
    /// The workspace templates' size bound in bytes (0: none).
    pub template_cache_max_bytes: u64,
    /// Warm copies of the templates' workspaces (`crate::local::storage::template`'s `warm`);
    /// off by default here, on by default for the service (`--warm-copies`).
    pub warm: WarmBounds,
    /// What sandboxes' CPU, memory and wall time cost.
    pub prices: Prices,
    /// Sandboxed commands run under the seccomp filters of `crate::local::isolation::bubblewrap::seccomp`.
    pub seccomp: bool,
    /// Loopback, link-local or private addresses an `egress_allow` list may name (the
    /// operator's choice); any other is refused, so no sandbox reaches the host's or the
    /// mesh's own services.
    pub egress_private_allowed: Vec<std::net::IpAddr>,
    /// The git hosts a create's repository may be cloned from (`crate::git::reach`).
    pub git_hosts: AllowedHosts,
    /// The git credentials the mesh holds per tenant and host: used by the host's git
    /// for a clone, never given to a sandbox.
    pub git_credentials: std::sync::Arc<forkyard_common::git_credentials::GitCredentials>,
}

impl Config {
    pub fn new(state_dir: impl Into<PathBuf>, advertise_endpoint: impl Into<String>) -> Self {
        let state_dir: PathBuf = state_dir.into();
        Self {
            snapshot_dir: state_dir.join("snapshots"),
            image_archive_dir: None,
            image_cache_dir: state_dir.join("images"),
            registry: RegistryConfig::default(),
            image_cache_max_bytes: 20 << 30,
            image_limits: image::UnpackLimits::DEFAULT,
            template_cache_max_bytes: 10 << 30,
            warm: WarmBounds::OFF,
            state_dir,
            bwrap_path: "bwrap".into(),
            runsc_path: "runsc".into(),
            runsc_platform: None,
            advertise_endpoint: advertise_endpoint.into(),
            owner_task_queue: String::new(),
            exec_timeout: Duration::from_secs(600),
            clone_timeout: Duration::from_secs(300),
            allow_no_userns: false,
            sandbox_uid_base: uids::DEFAULT_BASE,
            sandbox_uid_count: uids::DEFAULT_COUNT,
            cgroup_parent: Some("forkyard".into()),
            require_cgroups: false,
            default_limits: Limits {
                memory_bytes: 4 << 30,
                pids: 1024,
                cpu_millis: 2000,
            },
            default_disk_bytes: 10 << 30,
            disk_quota: QuotaMode::Auto,
            btrfs_path: "btrfs".into(),
            default_ttl: Duration::from_secs(4 * 3600),
            maxima: crate::maxima::Maxima::DEFAULT,
            llm_relay: RelayLimits::DEFAULT,
            egress: crate::local::isolation::network::egress::DEFAULT_LIMITS,
            reap_interval: Duration::from_secs(30),
            forwarder_path: None,
            agent_tools: None,
            toolchains: Vec::new(),
            sandbox_init: true,
            workspace_overlay: true,
            prices: Prices::default(),
            egress_private_allowed: Vec::new(),
            git_hosts: AllowedHosts::any_public(GIT_HOSTS_SETTING),
            git_credentials: std::sync::Arc::new(
                forkyard_common::git_credentials::GitCredentials::none(),
            ),
            seccomp: true,
        }
    }
}
