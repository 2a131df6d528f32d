//! Command-line flags (each also read from an environment variable).

use crate::{
    e2b::{E2bArgs, E2bConfig},
    local::{
        core::config::Config,
        isolation::{cgroup::Limits, uids},
        storage::{disk_quota, image, image::registry},
    },
    usage::Prices,
};
use forkyard_common::{
    advertise::hostname,
    allowed_hosts::AllowedHosts,
    config::{StateDirArg, TemporalArgs, parse_listen},
};
use std::{
    net::{IpAddr, SocketAddr},
    path::PathBuf,
    time::Duration,
};

/// The settings of the hosts a create may make this replica reach, as errors name them
/// (defined where the local backend's defaults name them too).
pub use crate::local::{
    core::config::GIT_HOSTS_SETTING, storage::image::registry::REGISTRIES_SETTING,
};

#[derive(Debug, clap::Parser)]
#[command(
    name = "sandbox-provisioner",
    about = "Forkyard sandbox provisioner: bubblewrap sandboxes over gRPC and Temporal"
)]
pub struct Args {
    /// gRPC listen address.
    #[arg(long, env = "FORKYARD_LISTEN", default_value = "127.0.0.1:50052")]
    pub listen: String,
    /// gRPC endpoint other services reach this replica at (stored on each sandbox);
    /// default `http://<listen>`.
    #[arg(long, env = "FORKYARD_ADVERTISE_ENDPOINT")]
    pub advertise_endpoint: Option<String>,
    /// This replica's id; it also polls Temporal task queue `sandbox-provisioner/<id>`,
    /// where every activity about a sandbox it owns is sent. Default `<hostname>-<port>`,
    /// stable across restarts of the same replica.
    #[arg(long, env = "FORKYARD_PROVISIONER_REPLICA_ID")]
    pub replica_id: Option<String>,
    #[command(flatten)]
    pub temporal: TemporalArgs,
    #[command(flatten)]
    pub metrics: forkyard_common::metrics::MetricsArgs,
    /// Mesh TLS: this service's certificate, key and the mesh CA (mTLS when set).
    #[command(flatten)]
    pub tls: forkyard_common::tls::TlsArgs,
    #[command(flatten)]
    pub state: StateDirArg,
    /// The bubblewrap binary (a path or a name on $PATH).
    #[arg(long, env = "FORKYARD_BWRAP_PATH", default_value = "bwrap")]
    pub bwrap_path: PathBuf,
    /// gVisor's runsc (a path or a name on $PATH), for sandboxes created with
    /// `isolation: gvisor`; missing or unable to run here, such a create is
    /// FAILED_PRECONDITION saying why (Debian's package: `runsc`).
    #[arg(long, env = "FORKYARD_RUNSC_PATH", default_value = "runsc")]
    pub runsc_path: PathBuf,
    /// runsc's `--platform` for gVisor sandboxes (ptrace, systrap on newer runsc, kvm
    /// with /dev/kvm); empty: runsc's default.
    #[arg(long, env = "FORKYARD_RUNSC_PLATFORM", default_value = "")]
    pub runsc_platform: String,
    /// Exec wall-clock limit when a request gives none.
    #[arg(long, env = "FORKYARD_EXEC_TIMEOUT_SECS", default_value_t = 600)]
    pub exec_timeout_secs: u64,
    /// Limit for cloning a sandbox's repository.
    #[arg(long, env = "FORKYARD_CLONE_TIMEOUT_SECS", default_value_t = 300)]
    pub clone_timeout_secs: u64,
    /// On SIGTERM, how long to wait for the sandboxes this replica holds to be destroyed
    /// (their forks finish; new sandboxes go to other replicas) before exiting. Sandboxes
    /// left then stay on disk and are taken over at the next start. Keep the runtime's
    /// grace period (terminationGracePeriodSeconds, Compose stop_grace_period) above it.
    #[arg(long, env = "FORKYARD_DRAIN_TIMEOUT_SECS", default_value_t = 300)]
    pub drain_timeout_secs: u64,
    /// Run sandboxes without a user namespace when the host cannot create one (refused
    /// by default).
    #[arg(long, env = "FORKYARD_ALLOW_NO_USERNS", default_value_t = false)]
    pub allow_no_userns: bool,
    /// When the provisioner runs as root: the first host uid given to sandboxes, each
    /// sandbox its own (its workspace is owned by it and its commands run as it); 0 runs
    /// sandboxes as root. Not used when the provisioner is not root (sandboxes then run
    /// as its own uid).
    #[arg(long, env = "FORKYARD_SANDBOX_UID_BASE", default_value_t = uids::DEFAULT_BASE)]
    pub sandbox_uid_base: u32,
    /// How many uids from FORKYARD_SANDBOX_UID_BASE (at most this many sandboxes at once).
    #[arg(long, env = "FORKYARD_SANDBOX_UID_COUNT", default_value_t = uids::DEFAULT_COUNT)]
    pub sandbox_uid_count: u32,
    /// Cgroup (under each hierarchy's root) that holds one group per sandbox; empty
    /// disables cgroups.
    #[arg(long, env = "FORKYARD_CGROUP_PARENT", default_value = "forkyard")]
    pub cgroup_parent: String,
    /// Refuse to start without working cgroups (default: warn and run without limits).
    #[arg(long, env = "FORKYARD_REQUIRE_CGROUPS", default_value_t = false)]
    pub require_cgroups: bool,
    /// Default memory limit per sandbox, MiB (0 = unlimited).
    #[arg(long, env = "FORKYARD_SANDBOX_MEMORY_MB", default_value_t = 4096)]
    pub sandbox_memory_mb: u64,
    /// Default process/thread limit per sandbox (0 = unlimited).
    #[arg(long, env = "FORKYARD_SANDBOX_PIDS", default_value_t = 1024)]
    pub sandbox_pids: u64,
    /// Default CPU limit per sandbox in thousandths of a core (0 = unlimited).
    #[arg(long, env = "FORKYARD_SANDBOX_CPU_MILLIS", default_value_t = 2000)]
    pub sandbox_cpu_millis: u64,
    /// Default workspace size bound per sandbox, MiB (0 = unbounded).
    #[arg(long, env = "FORKYARD_SANDBOX_DISK_MB", default_value_t = 10240)]
    pub sandbox_disk_mb: u64,
    /// A hard quota per sandbox at its disk bound (plus a margin): `auto` where the
    /// state directory is on btrfs with quotas enabled and the provisioner is root,
    /// `required` to refuse to start otherwise, `off` for the workspace watch alone.
    #[arg(long, env = "FORKYARD_SANDBOX_DISK_QUOTA", value_enum, default_value_t = disk_quota::QuotaMode::Auto)]
    pub sandbox_disk_quota: disk_quota::QuotaMode,
    /// The btrfs tool (btrfs-progs), for the quotas: a path or a name on $PATH.
    #[arg(long, env = "FORKYARD_BTRFS_PATH", default_value = "btrfs")]
    pub btrfs_path: PathBuf,
    /// Default sandbox lifetime; the provisioner destroys it afterwards (0 = no TTL).
    #[arg(long, env = "FORKYARD_SANDBOX_TTL_SECS", default_value_t = 14400)]
    pub sandbox_ttl_secs: u64,
    #[command(flatten)]
    pub maxima: crate::maxima::MaximaArgs,
    #[command(flatten)]
    pub llm_relay: crate::local::RelayLimitsArgs,
    /// Connections one sandbox's egress proxy holds at once (each two of the
    /// provisioner's descriptors); past them the sandbox's new connections wait.
    #[arg(long, env = "FORKYARD_EGRESS_MAX_CONNECTIONS", default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..))]
    pub egress_max_connections: u32,
    /// How long a connection to a sandbox's egress proxy may take to send its request's
    /// head (a CONNECT or a plain-HTTP request), and to be connected upstream.
    #[arg(long, env = "FORKYARD_EGRESS_HEADER_TIMEOUT_SECS", default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..))]
    pub egress_header_timeout_secs: u64,
    /// How long a connection through a sandbox's egress proxy may move no byte either
    /// way before it is closed.
    #[arg(long, env = "FORKYARD_EGRESS_IDLE_TIMEOUT_SECS", default_value_t = 900, value_parser = clap::value_parser!(u64).range(1..))]
    pub egress_idle_timeout_secs: u64,
    /// How often expired sandboxes are looked for.
    #[arg(long, env = "FORKYARD_REAP_INTERVAL_SECS", default_value_t = 30)]
    pub reap_interval_secs: u64,
    /// The `sandbox-egress-forwarder` binary (default: next to this executable); egress
    /// allowlists are refused when it is missing.
    #[arg(long, env = "FORKYARD_EGRESS_FORWARDER")]
    pub egress_forwarder: Option<PathBuf>,
    #[command(flatten)]
    pub host_tools: crate::local::isolation::host_tools::HostToolsArgs,
    /// Where workspace snapshots are stored (default `<state>/snapshots`).
    #[arg(long, env = "FORKYARD_SNAPSHOT_DIR")]
    pub snapshot_dir: Option<PathBuf>,
    /// Image archives (`docker save` output, OCI layouts as directories or tars) a
    /// create may name as `image: "archive:<file name>"`; unset: none offered.
    #[arg(long, env = "FORKYARD_IMAGE_ARCHIVE_DIR")]
    pub image_archive_dir: Option<PathBuf>,
    /// Where images are unpacked, once per digest (default `<state>/images`).
    #[arg(long, env = "FORKYARD_IMAGE_CACHE_DIR")]
    pub image_cache_dir: Option<PathBuf>,
    /// The image cache's size bound in bytes; least recently used images no sandbox
    /// runs on are removed past it. 0: no bound.
    #[arg(long, env = "FORKYARD_IMAGE_CACHE_MAX_BYTES", default_value_t = 20 << 30)]
    pub image_cache_max_bytes: u64,
    /// What one image may unpack to, in bytes (its layers' uncompressed tars, counted as
    /// they are read: a small gzip that inflates past it is stopped there). 0: no bound.
    #[arg(long, env = "FORKYARD_IMAGE_MAX_BYTES", default_value_t = 8 << 30)]
    pub image_max_bytes: u64,
    /// What one image may unpack to, in entries (files, directories, links). 0: no bound.
    #[arg(long, env = "FORKYARD_IMAGE_MAX_ENTRIES", default_value_t = 1_000_000)]
    pub image_max_entries: u64,
    /// The workspace templates' size bound in bytes (`<state>/templates`, a clone per
    /// local repository, and per tenant and remote repository); least recently used
    /// ones are removed past it. 0: no bound.
    #[arg(long, env = "FORKYARD_TEMPLATE_CACHE_MAX_BYTES", default_value_t = 10 << 30)]
    pub template_cache_max_bytes: u64,
    /// Warm copies of a template's workspace kept ready for creates, at most this many a
    /// template: as many as its creates in the last minute, dropped ten minutes after
    /// its last. 0: none (every create copies its template). Off with a hard disk quota.
    #[arg(long, env = "FORKYARD_WARM_COPIES", default_value_t = 128)]
    pub warm_copies: usize,
    /// The warm copies' bound in bytes, over all templates.
    #[arg(long, env = "FORKYARD_WARM_COPIES_MAX_BYTES", default_value_t = 1 << 30)]
    pub warm_copies_max_bytes: u64,
    /// At least this many warm copies of each template a create used in the last ten
    /// minutes, whatever its demand (within --warm-copies and --warm-copies-max-bytes):
    /// the largest fan-out expected, so a run larger than the last minute's finds its
    /// workspaces made too. 0: as many as the last minute's creates. Unset: all of
    /// --warm-copies where workspaces are overlays (a warm overlay is a few inodes and
    /// a mount, none of the worktree's bytes), 0 where they are copies.
    #[arg(long, env = "FORKYARD_WARM_COPIES_MIN")]
    pub warm_copies_min: Option<usize>,
    /// Registry credentials for image pulls: a Docker `config.json` (`docker login`'s, or
    /// a Kubernetes image pull secret's `.dockerconfigjson`), read at each pull; its
    /// `credHelpers`/`credsStore` helpers (`docker-credential-<name>` on PATH) run then.
    #[arg(long, env = "FORKYARD_REGISTRY_AUTH_FILE")]
    pub registry_auth_file: Option<PathBuf>,
    /// Registries pulled from over plain HTTP (`host:port`, comma-separated); loopback
    /// registries always are.
    #[arg(long, env = "FORKYARD_REGISTRY_INSECURE", value_delimiter = ',')]
    pub registry_insecure: Vec<String>,
    /// Registries a create's image may be pulled from (comma-separated `host`,
    /// `host:port`, `*.domain`, `*.domain:port`). Empty: any registry whose addresses
    /// are all public; loopback, private, link-local (metadata) and other special
    /// addresses only for a registry listed here exactly.
    #[arg(long, env = "FORKYARD_ALLOWED_REGISTRIES", value_delimiter = ',')]
    pub allowed_registries: Vec<String>,
    /// Git hosts a create's repository may be cloned from, as --allowed-registries.
    #[arg(long, env = "FORKYARD_ALLOWED_GIT_HOSTS", value_delimiter = ',')]
    pub allowed_git_hosts: Vec<String>,
    /// The git credentials the mesh holds per tenant and host (a TOML file, read again
    /// when it changes; docs/security.md, Repositories): the host's git clones with
    /// them, and no sandbox ever holds one.
    #[arg(long, env = "FORKYARD_GIT_CREDENTIALS")]
    pub git_credentials: Option<PathBuf>,
    /// A token for github.com every tenant may use (the simplest form, for the local
    /// stack); a tenant's own entry in `--git-credentials` wins.
    #[arg(long, env = "GITHUB_TOKEN", hide_env_values = true)]
    pub github_token: Option<String>,
    /// USD per CPU-second a local sandbox uses (charged to its fork's budget; 0 = free).
    #[arg(
        long,
        env = "FORKYARD_SANDBOX_CPU_SECOND_USD",
        default_value_t = 0.000014
    )]
    pub sandbox_cpu_second_usd: f64,
    /// USD per GiB of memory a local sandbox holds for a second while its commands run.
    #[arg(
        long,
        env = "FORKYARD_SANDBOX_GIB_SECOND_USD",
        default_value_t = 0.0000045
    )]
    pub sandbox_gib_second_usd: f64,
    /// Loopback, link-local or private IP addresses `egress_allow` lists may name
    /// (comma-separated); by default none, so no sandbox reaches the host's or the mesh's
    /// own services.
    #[arg(long, env = "FORKYARD_EGRESS_PRIVATE_ALLOWED", value_delimiter = ',')]
    pub egress_private_allowed: Vec<String>,
    /// Run sandboxed commands under the seccomp filters that refuse the kernel calls an
    /// agent has no use for (keyrings, bpf, namespaces, mounts, modules, clocks, …).
    #[arg(long, env = "FORKYARD_SANDBOX_SECCOMP", default_value_t = true, action = clap::ArgAction::Set)]
    pub sandbox_seccomp: bool,
    /// Run each sandbox's commands as children of one long-lived bubblewrap per sandbox
    /// (its init, started at its first command), not a bubblewrap per command. Needs the
    /// egress forwarder, which is that init; off: a bubblewrap per command, as before.
    #[arg(long, env = "FORKYARD_SANDBOX_INIT", default_value_t = true, action = clap::ArgAction::Set)]
    pub sandbox_init: bool,
    /// Give a template's sandbox an overlay of the template's workspace instead of a
    /// copy: a create makes a few inodes whatever the worktree's size. Needs a uid per
    /// sandbox (root) and Linux 6.15 or later; where it cannot work, templates are copied
    /// and the start-up log says why.
    #[arg(long, env = "FORKYARD_WORKSPACE_OVERLAY", default_value_t = true, action = clap::ArgAction::Set)]
    pub workspace_overlay: bool,
    #[command(flatten)]
    pub e2b: E2bArgs,
}

impl Args {
    /// The listen address and the two backends' settings; errors name the setting.
    pub fn resolve(&self) -> Result<(SocketAddr, Config, E2bConfig), String> {
        let listen = parse_listen("--listen (FORKYARD_LISTEN)", &self.listen)?;
        let local = self.local(listen)?;
        let e2b = self.e2b.resolve(&local)?;
        Ok((listen, local, e2b))
    }

    /// The local backend's settings (the replica's endpoint and queue among them).
    fn local(&self, listen: SocketAddr) -> Result<Config, String> {
        if self.exec_timeout_secs == 0 {
            return Err(
                "--exec-timeout-secs (FORKYARD_EXEC_TIMEOUT_SECS) must be at least 1".into(),
            );
        }
        if self.clone_timeout_secs == 0 {
            return Err(
                "--clone-timeout-secs (FORKYARD_CLONE_TIMEOUT_SECS) must be at least 1".into(),
            );
        }
        let advertise = forkyard_common::advertise::resolve(
            "--advertise-endpoint (FORKYARD_ADVERTISE_ENDPOINT)",
            self.advertise_endpoint.as_deref(),
            listen,
        )?;
        if self.reap_interval_secs == 0 {
            return Err(
                "--reap-interval-secs (FORKYARD_REAP_INTERVAL_SECS) must be at least 1".into(),
            );
        }
        let state_dir = self.state.ensure()?;
        let replica = match &self.replica_id {
            Some(id) => id.trim().to_owned(),
            None => format!("{}-{}", hostname(), listen.port()),
        };
        check_replica_id(&replica)?;
        let mut config = Config::new(state_dir, advertise);
        config.owner_task_queue = replica_task_queue(&replica);
        config.bwrap_path.clone_from(&self.bwrap_path);
        config.runsc_path.clone_from(&self.runsc_path);
        config.runsc_platform =
            Some(self.runsc_platform.trim().to_owned()).filter(|p| !p.is_empty());
        config.exec_timeout = Duration::from_secs(self.exec_timeout_secs);
        config.clone_timeout = Duration::from_secs(self.clone_timeout_secs);
        config.allow_no_userns = self.allow_no_userns;
        self.sandbox_bounds(&mut config)?;
        config.forwarder_path = self.forwarder();
        config.agent_tools = self.host_tools.agent_tools()?;
        config.toolchains = self.host_tools.toolchains()?;
        self.storage(&mut config)?;
        config.prices = self.prices()?;
        config.seccomp = self.sandbox_seccomp;
        config.sandbox_init = self.sandbox_init;
        config.workspace_overlay = self.workspace_overlay;
        config.egress_private_allowed = self.egress_private_allowed()?;
        config.git_hosts = AllowedHosts::parse(GIT_HOSTS_SETTING, &self.allowed_git_hosts)?;
        config.git_credentials = std::sync::Arc::new(
            forkyard_common::git_credentials::GitCredentials::open(
                self.git_credentials.clone(),
                self.github_token.clone(),
            )
            .map_err(|e| format!("--git-credentials: {e}"))?,
        );
        Ok(config)
    }

    /// What holds each sandbox in: its uid, its cgroup and limits, its disk, its lifetime.
    fn sandbox_bounds(&self, config: &mut Config) -> Result<(), String> {
        uids::SandboxUids::check(self.sandbox_uid_base, self.sandbox_uid_count)?;
        config.sandbox_uid_base = self.sandbox_uid_base;
        config.sandbox_uid_count = self.sandbox_uid_count;
        let parent = self.cgroup_parent.trim();
        if parent.contains("..") || parent.starts_with('/') {
            return Err("--cgroup-parent (FORKYARD_CGROUP_PARENT) must be a relative name".into());
        }
        config.cgroup_parent = (!parent.is_empty()).then(|| parent.to_owned());
        config.require_cgroups = self.require_cgroups;
        config.default_limits = Limits {
            memory_bytes: self.sandbox_memory_mb << 20,
            pids: self.sandbox_pids,
            cpu_millis: self.sandbox_cpu_millis,
        };
        config.default_disk_bytes = self.sandbox_disk_mb << 20;
        config.disk_quota = self.sandbox_disk_quota;
        config.btrfs_path.clone_from(&self.btrfs_path);
        config.default_ttl = Duration::from_secs(self.sandbox_ttl_secs);
        config.reap_interval = Duration::from_secs(self.reap_interval_secs);
        config.maxima = self.maxima.maxima(
            config.default_limits,
            config.default_disk_bytes,
            config.default_ttl,
        )?;
        config.llm_relay = self.llm_relay.limits();
        config.egress = forkyard_common::http_limits::Limits {
            max_connections: usize::try_from(self.egress_max_connections).unwrap_or(usize::MAX),
            header_timeout: Duration::from_secs(self.egress_header_timeout_secs),
            idle_timeout: Duration::from_secs(self.egress_idle_timeout_secs),
        };
        Ok(())
    }

    /// The forwarder named, or the one installed next to this executable; an empty name
    /// offers none.
    fn forwarder(&self) -> Option<PathBuf> {
        match &self.egress_forwarder {
            Some(p) if p.as_os_str().is_empty() => None,
            Some(p) => Some(p.clone()),
            None => std::env::current_exe()
                .ok()
                .and_then(|e| Some(e.parent()?.join("sandbox-egress-forwarder")))
                .filter(|p| p.is_file()),
        }
    }

    /// Where snapshots, images and templates are kept, and how images are pulled.
    fn storage(&self, config: &mut Config) -> Result<(), String> {
        if let Some(dir) = &self.snapshot_dir {
            config.snapshot_dir.clone_from(dir);
        }
        config.image_archive_dir.clone_from(&self.image_archive_dir);
        config.image_cache_max_bytes = self.image_cache_max_bytes;
        // 0 is no bound, as for the other sizes here.
        let unbounded = |n: u64| if n == 0 { u64::MAX } else { n };
        config.image_limits = image::UnpackLimits {
            bytes: unbounded(self.image_max_bytes),
            entries: unbounded(self.image_max_entries),
        };
        config.template_cache_max_bytes = self.template_cache_max_bytes;
        config.warm = crate::local::WarmBounds {
            copies: self.warm_copies,
            bytes: self.warm_copies_max_bytes,
            min: self
                .warm_copies_min
                .unwrap_or(crate::local::WarmBounds::MIN_AUTO),
        };
        config.registry = registry::RegistryConfig {
            auth_file: self.registry_auth_file.clone(),
            insecure: self.registry_insecure.clone(),
            allowed: AllowedHosts::parse(REGISTRIES_SETTING, &self.allowed_registries)?,
        };
        if let Some(dir) = &self.image_cache_dir {
            config.image_cache_dir.clone_from(dir);
        }
        Ok(())
    }

    fn prices(&self) -> Result<Prices, String> {
        let prices = Prices {
            cpu_second_usd: self.sandbox_cpu_second_usd,
            gib_second_usd: self.sandbox_gib_second_usd,
            e2b_second_usd: self.e2b.e2b_second_usd,
        };
        if !prices.valid() {
            return Err("FORKYARD_SANDBOX_CPU_SECOND_USD, FORKYARD_SANDBOX_GIB_SECOND_USD and FORKYARD_E2B_SECOND_USD must be numbers from 0 to 1 (USD)".into());
        }
        Ok(prices)
    }

    fn egress_private_allowed(&self) -> Result<Vec<IpAddr>, String> {
        self.egress_private_allowed
            .iter()
            .map(|a| a.trim())
            .filter(|a| !a.is_empty())
            .map(|a| {
                a.trim_start_matches('[').trim_end_matches(']').parse().map_err(|_| {
                    format!("--egress-private-allowed (FORKYARD_EGRESS_PRIVATE_ALLOWED): {a:?} is not an IP address")
                })
            })
            .collect()
    }
}

/// The task queue only replica `id` polls.
pub fn replica_task_queue(id: &str) -> String {
    format!("{}/{id}", forkyard_proto::queues::SANDBOX_PROVISIONER)
}

/// A replica id becomes part of a task queue name: keep it short and unambiguous.
fn check_replica_id(id: &str) -> Result<(), String> {
    const NAME: &str = "--replica-id (FORKYARD_PROVISIONER_REPLICA_ID)";
    if id.is_empty() || id.len() > 128 {
        return Err(format!("{NAME} must be 1 to 128 characters"));
    }
    if let Some(c) = id
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':')))
    {
        return Err(format!(
            "{NAME}: character {c:?} is not allowed (letters, digits, - _ . :)"
        ));
    }
    Ok(())
}

#[cfg(test)]
#[path = "config_tests.rs"]
mod tests;
