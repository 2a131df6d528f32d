//! The OCI bundle's `config.json` a gVisor sandbox starts from: what bubblewrap's command
//! line says for the same sandbox (`super::super::bubblewrap::bwrap::Invocation`), as
//! `runsc` reads it. The root is read-only (the host's /usr on a skeleton, or an image),
//! /proc, /dev, /tmp and /run are gVisor's own, the provisioner's relays and tools are
//! bound under /run/forkyard, the workspace at /workspace; no network but gVisor's own
//! loopback, no capabilities, no new privileges.

use crate::local::isolation::{
    bubblewrap::bwrap::{self, Invocation},
    host_tools::TOOLCHAINS,
    network::forwarder_kit,
};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};

/// Where every file of the provisioner's appears in a sandbox (relay sockets, the
/// forwarder's kit, agent tools, toolchains): one bind of a directory of the sandbox's
/// own, so an image's root needs one mount point for them all.
pub const RUN: &str = "/run/forkyard";

/// One bind mount of the host into the sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bind {
    pub source: PathBuf,
    /// Absolute, inside the sandbox.
    pub dest: String,
    pub writable: bool,
    /// Made on the host, in the mount namespace of the child that starts runsc, on its
    /// mount point in the root or in the directory bound at [`RUN`]: runsc then serves
    /// it as part of that mount. Each mount of `config.json` is a file-server connection
    /// of its own, set up at every start (the host's tools and the kit as mounts of their
    /// own: about a fifth of a start, measured). The workspace stays one: the
    /// provisioner writes it from the host, which the root's cache would not see.
    pub on_host: bool,
}

impl Bind {
    fn ro(source: impl Into<PathBuf>, dest: impl Into<String>) -> Self {
        Self {
            source: source.into(),
            dest: dest.into(),
            writable: false,
            on_host: false,
        }
    }

    fn on_host(self) -> Self {
        Self {
            on_host: true,
            ..self
        }
    }

    fn rw(source: impl Into<PathBuf>, dest: impl Into<String>) -> Self {
        Self {
            writable: true,
            ..Self::ro(source, dest)
        }
    }
}

/// One sandbox's container, before it is written as `config.json`.
#[derive(Debug, Clone)]
pub struct Container {
    /// `/`, read-only: the skeleton of the host's tools, or an image's root.
    pub root: PathBuf,
    /// Parents before what is bound inside them.
    pub binds: Vec<Bind>,
    /// The first process (the sandbox's init) and its environment.
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    /// `RLIMIT_NOFILE` (soft, hard) of the sandbox's processes.
    pub nofile: (u64, u64),
    /// `RLIMIT_FSIZE` (`crate::local::storage::disk_quota::file_size_limit`): gVisor's
    /// kernel holds it, not runsc's host processes (whose memory file it would bound).
    pub file_size: Option<u64>,
    /// The sandbox's processes (threads included), counted by gVisor's kernel as the
    /// host's pids controller counts a bubblewrap sandbox's (`RLIMIT_NPROC`: every
    /// process is gVisor's uid 0, without the capability that would lift it); `None`:
    /// no bound.
    pub processes: Option<u64>,
}

impl Container {
    /// The container for `inv`: `root` is its `/` (an image's root, or `skeleton` made
    /// for the host's tools), `run` the sandbox's own directory bound at [`RUN`].
    pub fn of(inv: &Invocation<'_>, skeleton: &Path, run: &Path, nofile: (u64, u64)) -> Self {
        let mut binds = Vec::new();
        let root = match inv.image {
            Some(img) => img.rootfs.to_path_buf(),
            None => {
                binds.extend(host_tools_binds().into_iter().map(Bind::on_host));
                skeleton.to_path_buf()
            }
        };
        // Over gVisor's own /run: a mount of runsc's, the binds below it the host's.
        binds.push(Bind::ro(run, RUN));
        if let Some(r) = inv.kit() {
            binds.push(Bind::ro(&r.forwarder.dir, forwarder_kit::IN_SANDBOX).on_host());
            for (_, inside, host) in r.pairs() {
                binds.push(Bind::rw(host, inside).on_host());
            }
        }
        if let Some(tools) = inv.tools {
            binds.push(Bind::ro(tools, bwrap::TOOLS).on_host());
        }
        for t in inv.toolchains {
            binds.push(Bind::ro(&t.dir, t.in_sandbox()).on_host());
        }
        binds.push(Bind::rw(inv.workspace, bwrap::WORKSPACE));
        debug_assert!(binds.iter().all(|b| b.dest.starts_with('/')));
        debug_assert!(TOOLCHAINS.starts_with(RUN) && bwrap::TOOLS.starts_with(RUN));
        Self {
            root,
            binds,
            args: inv.sandboxed_argv(),
            env: inv.env(),
            nofile,
            file_size: inv.file_size,
            processes: None,
        }
    }

    /// The bundle's `config.json`.
    pub fn config(&self) -> Value {
        let mut mounts = vec![
            json!({"destination": "/proc", "type": "proc", "source": "proc"}),
            json!({"destination": "/dev", "type": "tmpfs", "source": "tmpfs"}),
            json!({"destination": "/tmp", "type": "tmpfs", "source": "tmpfs"}),
            // Writable, as bubblewrap's /run is on an image; the relays are bound in it.
            json!({"destination": "/run", "type": "tmpfs", "source": "tmpfs"}),
        ];
        mounts.extend(self.binds.iter().filter(|b| !b.on_host).map(|b| {
            let mode = if b.writable { "rw" } else { "ro" };
            json!({
                "destination": b.dest,
                "type": "bind",
                "source": b.source,
                "options": ["rbind", mode, "nosuid", "nodev"],
            })
        }));
        let mut rlimits =
            vec![json!({"type": "RLIMIT_NOFILE", "soft": self.nofile.0, "hard": self.nofile.1})];
        if let Some(max) = self.file_size {
            rlimits.push(json!({"type": "RLIMIT_FSIZE", "soft": max, "hard": max}));
        }
        if let Some(max) = self.processes {
            rlimits.push(json!({"type": "RLIMIT_NPROC", "soft": max, "hard": max}));
        }
        let none: [&str; 0] = [];
        let namespaces: Vec<Value> = ["pid", "network", "ipc", "uts", "mount"]
            .iter()
            .map(|t| json!({"type": t}))
            .collect();
        let env: Vec<String> = self.env.iter().map(|(k, v)| format!("{k}={v}")).collect();
        json!({
            "ociVersion": "1.0.2",
            "process": {
                "terminal": false,
                // gVisor's root, without a capability: what it may do is gVisor's to
                // allow, and the host sees the sandbox's own uid (runsc runs as it).
                "user": {"uid": 0, "gid": 0},
                "args": self.args,
                "env": env,
                "cwd": bwrap::WORKSPACE,
                "capabilities": {
                    "bounding": none, "effective": none, "inheritable": none,
                    "permitted": none, "ambient": none,
                },
                "noNewPrivileges": true,
                "rlimits": rlimits,
            },
            "root": {"path": self.root, "readonly": true},
            "hostname": bwrap::HOSTNAME,
            "mounts": mounts,
            "linux": {"namespaces": namespaces},
        })
    }

    /// Each bind's mount point as runsc's file server needs it on the host: `(base,
    /// path below it)`, the base the innermost other bind that holds it or the root;
    /// `true` for a directory. runsc makes none itself in a read-only root.
    pub fn mount_points(&self) -> Vec<(PathBuf, PathBuf, bool)> {
        self.binds
            .iter()
            .map(|b| {
                let (base, rel) = self.mount_point(b);
                (base, rel, b.source.is_dir())
            })
            .collect()
    }

    /// `b`'s mount point: (base, path below it).
    fn mount_point(&self, b: &Bind) -> (PathBuf, PathBuf) {
        let parent = self
            .binds
            .iter()
            .filter(|p| p.dest != b.dest && within(&b.dest, &p.dest))
            .max_by_key(|p| p.dest.len());
        // A host-side bind inside another would land on that one's source, which the
        // other's mount (made before it) would not show.
        debug_assert!(!(b.on_host && parent.is_some_and(|p| p.on_host)));
        let (base, at) = match parent {
            Some(p) => (p.source.as_path(), p.dest.as_str()),
            None => (self.root.as_path(), "/"),
        };
        let rel = b.dest[at.len()..].trim_start_matches('/');
        (base.to_path_buf(), PathBuf::from(rel))
    }

    /// The host-side binds ([`Bind::on_host`]), parents first: (source, the host path of
    /// its mount point, writable).
    pub fn host_binds(&self) -> Vec<(PathBuf, PathBuf, bool)> {
        self.binds
            .iter()
            .filter(|b| b.on_host)
            .map(|b| {
                let (base, rel) = self.mount_point(b);
                (b.source.clone(), base.join(rel), b.writable)
            })
            .collect()
    }
}

/// Whether `path` is `dir` or below it (whole components).
fn within(path: &str, dir: &str) -> bool {
    let dir = dir.trim_end_matches('/');
    path == dir || path.strip_prefix(dir).is_some_and(|r| r.starts_with('/'))
}

/// The host's /usr, its real top-level directories (the symbolic links are the
/// skeleton's) and the few files of /etc programs need, read-only: what bubblewrap binds.
fn host_tools_binds() -> Vec<Bind> {
    let mut binds = vec![Bind::ro("/usr", "/usr")];
    for (path, link) in bwrap::host_root_links() {
        if link.is_none() {
            binds.push(Bind::ro(path, path.display().to_string()));
        }
    }
    for path in bwrap::ETC_ALWAYS {
        if Path::new(path).exists() {
            binds.push(Bind::ro(*path, *path));
        }
    }
    binds
}

#[cfg(test)]
#[path = "bundle_tests.rs"]
mod tests;
