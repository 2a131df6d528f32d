//! Per-sandbox cgroups: memory, pids and CPU limits, and a reliable "kill everything in
//! this sandbox". Both hierarchies are supported; which one is used is decided at
//! start-up from the mount table (see [`crate::local::isolation::cgroup_detect`]):
//!
//! - **v2** (a unified mount offering memory, pids and cpu): one directory
//!   `<root>/<parent>/<id>` with `memory.max`, `memory.swap.max`, `pids.max`, `cpu.max`;
//!   killed with `cgroup.kill` (kernel ≥ 5.14), else freeze + SIGKILL.
//! - **v1** (one mount per controller): `<mount>/<parent>/<id>` under `memory`, `pids`,
//!   `cpu` and `freezer`; killed with freezer `FROZEN`, SIGKILL of every member, `THAWED`.
//!
//! A process joins the sandbox's cgroups before it execs bubblewrap (see
//! [`crate::local::isolation::bubblewrap::bwrap::Invocation::command`]), so nothing it starts is ever outside them.

use crate::local::isolation::cgroup_detect;
use std::{
    io,
    path::{Path, PathBuf},
    time::Duration,
};

use crate::local::isolation::cgroup_detect::{Layout, V1_CONTROLLERS};

/// Limits of one sandbox; 0 means unlimited for that resource.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Limits {
    pub memory_bytes: u64,
    pub pids: u64,
    /// CPU in thousandths of a core (1000 = one full core).
    pub cpu_millis: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    V1,
    V2,
}

/// The cgroup parent of one provisioner: `<parent>/<key of its state dir>`, so that
/// provisioners with different state dirs on one host never touch each other's groups.
pub fn instance_parent(parent: &str, state_dir: &Path) -> String {
    let path = std::fs::canonicalize(state_dir).unwrap_or_else(|_| state_dir.to_path_buf());
    // FNV-1a: stable across builds (std's hasher is not).
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in path.as_os_str().as_encoded_bytes() {
        h = (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3);
    }
    format!("{parent}/{h:016x}")
}

/// Kill everything in, and remove, the groups of the provisioner whose state directory
/// is `state_dir`: for whoever killed it and will never start one on that directory
/// again (a test harness), since only a start on the same directory reconciles them.
pub fn remove_instance(parent: &str, state_dir: &Path) {
    if let Ok(cg) = Cgroups::detect(&instance_parent(parent, state_dir)) {
        cg.remove_all();
    }
}

/// The host's cgroup hierarchy as the provisioner uses it.
#[derive(Debug, Clone)]
pub struct Cgroups {
    pub version: Version,
    /// v2: `[<root>/<parent>]`; v1: `<mount>/<parent>` per controller of [`V1_CONTROLLERS`].
    parents: Vec<PathBuf>,
    /// v1 only: `<mount>/<parent>` of the `cpuacct` hierarchy when it is mounted apart
    /// from `cpu` (it counts the sandbox's CPU time; co-mounted, the cpu group does).
    cpuacct: Option<PathBuf>,
}

impl Cgroups {
    /// Find the hierarchy (from the mount table) and create `<parent>` where sandboxes
    /// go. `Err` explains why cgroups cannot be used (the caller decides whether that is
    /// fatal).
    pub fn detect(parent: &str) -> Result<Self, String> {
        let mut cg = Self::setup(&cgroup_detect::detect()?, parent)?;
        if cg.version == Version::V1
            && let Some(mount) = cgroup_detect::v1_mount_of("cpuacct")
            && cg
                .parents
                .get(2)
                .is_some_and(|cpu| !cpu.starts_with(&mount))
        {
            let dir = mount.join(parent);
            // Without it the sandbox's CPU time is not counted (nor charged), nothing else.
            match mkdir(&dir) {
                Ok(()) => cg.cpuacct = Some(dir),
                Err(e) => {
                    tracing::warn!(error = %e, "cpuacct unavailable: sandbox CPU time is not metered")
                }
            }
        }
        Ok(cg)
    }

    /// Create `<parent>` in `layout`, enable the controllers down to it (v2), and prove a
    /// limited group can be made.
    pub(crate) fn setup(layout: &Layout, parent: &str) -> Result<Self, String> {
        let cg = match layout {
            Layout::V2 { root } => Self {
                version: Version::V2,
                parents: vec![v2_parent(root, parent)?],
                cpuacct: None,
            },
            Layout::V1 { mounts } => Self {
                version: Version::V1,
                parents: v1_parents(mounts, parent)?,
                cpuacct: None,
            },
        };
        // Prove it works end to end: a probe group with limits, then gone.
        cg.create(
            "probe",
            Limits {
                memory_bytes: 64 << 20,
                pids: 16,
                cpu_millis: 500,
            },
        )
        .map_err(|e| format!("cannot create a limited cgroup: {e}"))?;
        cg.remove("probe");
        Ok(cg)
    }

    fn dirs(&self, id: &str) -> Vec<PathBuf> {
        self.parents
            .iter()
            .chain(&self.cpuacct)
            .map(|p| p.join(id))
            .collect()
    }

    /// CPU time the sandbox's processes used, in microseconds; `None` where the host
    /// does not count it.
    pub fn cpu_usec(&self, id: &str) -> Option<u64> {
        match self.version {
            Version::V2 => {
                let text =
                    std::fs::read_to_string(self.parents[0].join(id).join("cpu.stat")).ok()?;
                text.lines().find_map(|l| {
                    l.strip_prefix("usage_usec ")
                        .and_then(|v| v.trim().parse().ok())
                })
            }
            Version::V1 => {
                let dir = self.cpuacct.as_ref().unwrap_or(&self.parents[2]).join(id);
                let ns: u64 = std::fs::read_to_string(dir.join("cpuacct.usage"))
                    .ok()?
                    .trim()
                    .parse()
                    .ok()?;
                Some(ns / 1000)
            }
        }
    }

    /// Memory the sandbox holds now (its processes and their page cache), in bytes.
    pub fn memory_bytes(&self, id: &str) -> Option<u64> {
        let file = match self.version {
            Version::V2 => "memory.current",
            Version::V1 => "memory.usage_in_bytes",
        };
        std::fs::read_to_string(self.parents[0].join(id).join(file))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    /// Create the sandbox's groups (idempotent) and apply `limits`.
    pub fn create(&self, id: &str, limits: Limits) -> io::Result<()> {
        for d in self.dirs(id) {
            match std::fs::create_dir(&d) {
                Err(e) if e.kind() != io::ErrorKind::AlreadyExists => return Err(e),
                _ => {}
            }
        }
        let period = 100_000u64;
        let quota = limits.cpu_millis * period / 1000;
        match self.version {
            Version::V2 => {
                let d = &self.dirs(id)[0];
                let max = |v: u64| {
                    if v == 0 {
                        "max".to_owned()
                    } else {
                        v.to_string()
                    }
                };
                write(d, "memory.max", &max(limits.memory_bytes))?;
                let _ = write(d, "memory.swap.max", "0");
                write(d, "pids.max", &max(limits.pids))?;
                write(d, "cpu.max", &format!("{} {period}", max(quota)))?;
            }
            Version::V1 => {
                let dirs = self.dirs(id);
                let mem = if limits.memory_bytes == 0 {
                    "-1".to_owned()
                } else {
                    limits.memory_bytes.to_string()
                };
                write(&dirs[0], "memory.limit_in_bytes", &mem)?;
                // Swap counts too where the kernel accounts it (no swap is the usual case).
                let _ = write(&dirs[0], "memory.memsw.limit_in_bytes", &mem);
                let pids = if limits.pids == 0 {
                    "max".to_owned()
                } else {
                    limits.pids.to_string()
                };
                write(&dirs[1], "pids.max", &pids)?;
                // Each write makes the kernel walk every task group: skip the period's
                // when it is already the default.
                let current = std::fs::read_to_string(dirs[2].join("cpu.cfs_period_us"));
                if current.map_or(true, |c| c.trim() != period.to_string()) {
                    write(&dirs[2], "cpu.cfs_period_us", &period.to_string())?;
                }
                let q = if quota == 0 {
                    "-1".to_owned()
                } else {
                    quota.max(1000).to_string()
                };
                write(&dirs[2], "cpu.cfs_quota_us", &q)?;
            }
        }
        Ok(())
    }

    /// The files a process writes "0" into to join the sandbox's groups itself, before
    /// it execs what starts the sandbox (a single-threaded child: bubblewrap's or
    /// runsc's). v1: `tasks`, which moves the writing thread only; `cgroup.procs` moves
    /// its whole thread group under the kernel's global threadgroup lock, whose first
    /// writer after a quiet spell waits out an RCU grace period (8–20 ms on this host,
    /// in front of every sandbox's start; 0.3 ms through `tasks`). For a one-thread
    /// process both move the same. v2 has no `tasks`: `cgroup.procs`.
    pub fn join_files(&self, id: &str) -> Vec<PathBuf> {
        let file = match self.version {
            Version::V1 => "tasks",
            Version::V2 => "cgroup.procs",
        };
        self.dirs(id).into_iter().map(|d| d.join(file)).collect()
    }

    /// Pids currently in the sandbox's groups.
    pub fn pids(&self, id: &str) -> Vec<i32> {
        let Some(d) = self.dirs(id).pop() else {
            return Vec::new();
        };
        std::fs::read_to_string(d.join("cgroup.procs"))
            .unwrap_or_default()
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .collect()
    }

    /// How many times the kernel OOM-killed a process of the sandbox.
    pub fn oom_kills(&self, id: &str) -> u64 {
        let d = &self.dirs(id)[0];
        let (file, key) = match self.version {
            Version::V2 => ("memory.events", "oom_kill"),
            Version::V1 => ("memory.oom_control", "oom_kill"),
        };
        let text = std::fs::read_to_string(d.join(file)).unwrap_or_default();
        let count = text.lines().find_map(|l| {
            let (k, v) = l.split_once(' ')?;
            (k == key).then(|| v.trim().parse().ok()).flatten()
        });
        match count {
            Some(n) => n,
            // Older v1 kernels have no counter: failcnt > 0 means the limit was hit.
            None => std::fs::read_to_string(d.join("memory.failcnt"))
                .ok()
                .and_then(|s| s.trim().parse().ok())
                .unwrap_or(0),
        }
    }

    /// Kill every process of the sandbox and wait (bounded) until the groups are empty.
    pub fn kill_all(&self, id: &str) {
        let dirs = self.dirs(id);
        if self.version == Version::V2 && write(&dirs[0], "cgroup.kill", "1").is_ok() {
            wait_empty(KILLED, || self.pids(id).is_empty());
            return;
        }
        // No freeze when one kill of every member empties the group, as it does unless
        // something hostile forks faster than the listing: every process of a sandbox is
        // in a pid namespace whose first process is in the group (usually killed just
        // before, with the init), and once that one is dead the kernel kills the rest and
        // nothing can start in the namespace. Each freeze and thaw of a first or last
        // frozen group switches a kernel static key, which patches kernel text with an
        // interrupt to every CPU: 1% of the machine's CPU at N = 100 when every destroy
        // froze its sandbox. An empty group being destroyed gets no new member.
        let pids = self.pids(id);
        if pids.is_empty() {
            return;
        }
        kill_each(&pids);
        if wait_empty(SETTLE, || self.pids(id).is_empty()) {
            return;
        }
        let freezer = match self.version {
            Version::V2 => (dirs[0].clone(), "cgroup.freeze", "1", "0"),
            Version::V1 => (dirs[3].clone(), "freezer.state", "FROZEN", "THAWED"),
        };
        for _ in 0..20 {
            let frozen = write(&freezer.0, freezer.1, freezer.2).is_ok();
            let pids = self.pids(id);
            kill_each(&pids);
            if frozen {
                let _ = write(&freezer.0, freezer.1, freezer.3);
            }
            if pids.is_empty() || wait_empty(KILLED, || self.pids(id).is_empty()) {
                return;
            }
        }
        tracing::warn!(sandbox_id = %id, "processes survived the cgroup kill");
    }

    /// Kill what is left and remove the sandbox's groups.
    pub fn remove(&self, id: &str) {
        self.kill_all(id);
        for d in self.dirs(id) {
            if let Err(e) = std::fs::remove_dir(&d)
                && e.kind() != io::ErrorKind::NotFound
            {
                tracing::warn!(cgroup = %d.display(), error = %e, "cannot remove cgroup");
            }
        }
    }

    /// Kill everything in every sandbox group under the parent and remove them, then the
    /// parent groups themselves.
    pub fn remove_all(&self) {
        for id in self.list() {
            self.remove(&id);
        }
        for d in self.parents.iter().chain(&self.cpuacct) {
            match std::fs::remove_dir(d) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => tracing::debug!(cgroup = %d.display(), error = %e, "cgroup parent kept"),
            }
        }
    }

    /// Ids of every sandbox group under the parent (for reconciliation at start-up).
    pub fn list(&self) -> Vec<String> {
        let Ok(entries) = std::fs::read_dir(&self.parents[0]) else {
            return Vec::new();
        };
        entries
            .flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect()
    }
}

fn mkdir(dir: &Path) -> Result<(), String> {
    match std::fs::create_dir_all(dir) {
        Err(e) if e.kind() != io::ErrorKind::AlreadyExists => {
            Err(format!("cannot create cgroup {}: {e}", dir.display()))
        }
        _ => Ok(()),
    }
}

fn write(dir: &Path, file: &str, value: &str) -> io::Result<()> {
    std::fs::write(dir.join(file), value)
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", dir.join(file).display())))
}

/// How long a kill waits for the group to empty (cgroup.kill, each pass of the freeze).
const KILLED: Duration = Duration::from_secs(1);

/// How long [`Cgroups::kill_all`] waits for a group to empty after one kill of each
/// member, before it freezes the group to kill what is left. Killed processes still need
/// the CPU to exit, which a hundred forks at once on two cores make wait.
const SETTLE: Duration = Duration::from_millis(250);

fn kill_each(pids: &[i32]) {
    for pid in pids {
        if let Some(p) = rustix::process::Pid::from_raw(*pid) {
            let _ = rustix::process::kill_process(p, rustix::process::Signal::KILL);
        }
    }
}

/// Wait up to `bound` for `empty`. Killed processes are usually gone within a
/// millisecond: the first looks come soon, later ones back off to every 10 ms.
fn wait_empty(bound: Duration, empty: impl Fn() -> bool) -> bool {
    let deadline = std::time::Instant::now() + bound;
    let mut pause = Duration::from_micros(200);
    while std::time::Instant::now() < deadline {
        if empty() {
            return true;
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(10));
    }
    empty()
}

/// `<root>/<parent>` made, with the controllers enabled in `cgroup.subtree_control` at
/// every level above the sandboxes' groups (only the leaves hold processes).
fn v2_parent(root: &Path, parent: &str) -> Result<PathBuf, String> {
    let mut dir = root.to_path_buf();
    let mut levels = vec![dir.clone()];
    for part in Path::new(parent).components() {
        dir.push(part);
        mkdir(&dir)?;
        levels.push(dir.clone());
    }
    for d in &levels {
        std::fs::write(d.join("cgroup.subtree_control"), "+memory +pids +cpu").map_err(|e| {
            format!(
                "cannot enable memory, pids and cpu controllers in {}: {e}{}",
                d.display(),
                if e.raw_os_error() == Some(16) {
                    " (it holds processes: a cgroup with controllers enabled \
                     for its children may not; run the provisioner in a leaf \
                     group or set FORKYARD_CGROUP_PARENT below a delegated one)"
                } else {
                    ""
                }
            )
        })?;
    }
    Ok(dir)
}

/// `<mount>/<parent>` made under each v1 controller's mount.
fn v1_parents(mounts: &[PathBuf], parent: &str) -> Result<Vec<PathBuf>, String> {
    let mut parents = Vec::new();
    for (c, mount) in V1_CONTROLLERS.iter().zip(mounts) {
        if !mount.join("cgroup.procs").exists() {
            return Err(format!(
                "cgroup v1 controller {c} is not mounted at {}",
                mount.display()
            ));
        }
        let dir = mount.join(parent);
        mkdir(&dir)?;
        parents.push(dir);
    }
    Ok(parents)
}

#[cfg(test)]
#[path = "cgroup_tests.rs"]
mod tests;
