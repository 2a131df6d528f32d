//! gVisor's runtime, for sandboxes created with `isolation: gvisor`: the sandbox's one
//! long-lived container (`runsc run`, [`launch`]) holds the same init as bubblewrap's
//! (the forwarder in `--init` mode, gVisor's pid 1), on the same root (the host's /usr on
//! a skeleton, or an image), with the same relays, workspace and cgroups ([`bundle`],
//! [`layout`]). Commands, streamed or not, reach that init over the same socket; every
//! system call they make is served by gVisor's kernel, never the host's directly.
//!
//! What differs (`docs/security.md`): a PTY's master stays in gVisor, relayed by the
//! init (gVisor cannot hand a descriptor of its own out); the provisioner's own steps on an image
//! (patch collection's git) run under bubblewrap, as they need the host's /usr; the
//! sandbox's memory is gVisor's, so a cgroup OOM kill ends the whole sandbox kernel (the
//! next command starts it again, the workspace intact).

pub mod bundle;
pub mod launch;
pub mod layout;

use launch::Runsc;
use std::{path::PathBuf, time::Duration};

/// How long the probe container may take: runsc's first start reads its binary and the
/// host's /usr from a cold cache.
const PROBE_LIMIT: Duration = Duration::from_secs(60);

/// Host tasks gVisor runs besides the sandbox's processes (runsc, its file server and
/// kernel threads: about 70 idle), and per process of the sandbox (on the ptrace
/// platform each is a host process of up to a dozen threads, and a fork bomb's burst
/// needs more: 16 was seen to end the sandbox's kernel at 128): what the host `pids.max`
/// allows over its own processes' limit, which gVisor's kernel holds (`RLIMIT_NPROC`).
const HOST_TASKS_BASE: u64 = 256;
const HOST_TASKS_PER_PROCESS: u64 = 32;
/// The most host tasks one gVisor sandbox may have (a tenth of Linux's default pid_max
/// of 32,768 would be 3,276; four times that leaves room for a sandbox's 1,024 processes).
const HOST_TASKS_MAX: u64 = 16_384;

/// The host cgroup's `pids.max` of a gVisor sandbox whose processes are limited to
/// `pids` inside (0: unlimited both).
pub fn host_pids(pids: u64) -> u64 {
    if pids == 0 {
        return 0;
    }
    HOST_TASKS_BASE
        .saturating_add(pids.saturating_mul(HOST_TASKS_PER_PROCESS))
        .min(HOST_TASKS_MAX)
}

/// What gVisor's own kernel and file server hold in the sandbox's memory cgroup besides
/// the sandbox's processes (their Go heaps: 50 to 100 MiB seen).
const HOST_MEMORY_OVERHEAD: u64 = 128 << 20;

/// The host cgroup's `memory.max` of a gVisor sandbox limited to `bytes` (0: unlimited):
/// its processes' memory is gVisor's, in the same cgroup as gVisor's own.
pub fn host_memory(bytes: u64) -> u64 {
    if bytes == 0 {
        0
    } else {
        bytes.saturating_add(HOST_MEMORY_OVERHEAD)
    }
}

/// runsc as this replica has it: found at start-up, tried once at the first create that
/// asks for it (a few hundred milliseconds), the answer kept.
pub struct Gvisor {
    /// The binary, or why there is none.
    runsc: Result<Runsc, String>,
    /// Where the probe's container is made (and removed).
    probe_dir: PathBuf,
    works: tokio::sync::OnceCell<Result<(), String>>,
}

impl Gvisor {
    /// `bin` (a path, or a name on `$PATH`) with `platform`.
    pub fn new(bin: &std::path::Path, platform: Option<String>, probe_dir: PathBuf) -> Self {
        let runsc = crate::local::base::fs::find_executable(bin)
            .map(|bin| Runsc { bin, platform })
            .ok_or_else(|| {
                format!(
                    "runsc (gVisor) is not installed: {} is not an executable file (--runsc-path, FORKYARD_RUNSC_PATH; Debian's package is `runsc`)",
                    bin.display()
                )
            });
        Self {
            runsc,
            probe_dir,
            works: tokio::sync::OnceCell::new(),
        }
    }

    /// runsc, once it has been seen to run a container here; why not otherwise (the
    /// message a create asking for gVisor gets, as FAILED_PRECONDITION).
    pub async fn ready(&self) -> Result<&Runsc, String> {
        let runsc = self.runsc.as_ref().map_err(Clone::clone)?;
        self.works
            .get_or_init(|| async {
                let got = launch::probe(runsc, &self.probe_dir, PROBE_LIMIT).await;
                match &got {
                    Ok(()) => {
                        tracing::info!(runsc = %runsc.bin.display(), "gVisor runs sandboxes here")
                    }
                    Err(e) => tracing::warn!(error = %e, "gVisor cannot run sandboxes here"),
                }
                got
            })
            .await
            .clone()
            .map(|()| runsc)
    }

    /// runsc, for a sandbox already made with gVisor (its create saw it run).
    pub(crate) fn runsc(&self) -> Result<&Runsc, String> {
        self.runsc.as_ref().map_err(Clone::clone)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_allows_gvisors_own_tasks_over_the_sandboxs_processes() {
        assert_eq!(host_pids(0), 0);
        assert_eq!(host_pids(32), 256 + 32 * 32);
        assert_eq!(host_pids(1 << 20), HOST_TASKS_MAX);
        assert_eq!(host_memory(0), 0);
        assert_eq!(host_memory(64 << 20), 192 << 20);
    }

    #[tokio::test]
    async fn a_missing_runsc_says_so_and_where_to_set_it() {
        let dir = tempfile::tempdir().unwrap();
        let g = Gvisor::new(
            &dir.path().join("no-such-runsc"),
            None,
            dir.path().join("probe"),
        );
        let err = g.ready().await.unwrap_err();
        assert!(err.contains("runsc (gVisor) is not installed"), "{err}");
        assert!(
            err.contains("no-such-runsc") && err.contains("FORKYARD_RUNSC_PATH"),
            "{err}"
        );
    }

    #[tokio::test]
    async fn a_runsc_that_fails_is_not_ready_and_says_why() {
        let dir = tempfile::tempdir().unwrap();
        // An executable that is not runsc: it fails as a broken install would.
        let fake = dir.path().join("runsc");
        std::fs::write(
            &fake,
            "#!/bin/sh\necho 'fake runsc: cannot start' >&2\nexit 3\n",
        )
        .unwrap();
        std::fs::set_permissions(&fake, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        let g = Gvisor::new(&fake, None, dir.path().join("probe"));
        let err = g.ready().await.unwrap_err();
        assert!(
            err.contains("cannot run a sandbox here") && err.contains("fake runsc: cannot start"),
            "{err}"
        );
        assert!(
            !dir.path().join("probe").exists(),
            "the probe's files are left"
        );
    }
}
