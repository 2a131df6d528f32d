//! The open-files limit: the provisioner's raised to its hard limit, a sandbox's the one
//! the replica was started with.
//!
//! Every command holds a few descriptors (pipes, its pidfd, cgroup files), and a walk
//! over a sandbox's tree holds one a level, up to `fd_walk::MAX_DEPTH`: systemd's
//! default soft limit (1,024) is below what a replica with hundreds of sandboxes needs.
//! A sandbox's processes get the operator's soft limit back, though: programs size
//! tables by it, and some close every descriptor up to it before they exec (a million
//! `close` calls a spawn under a hard limit of 1,048,576).

use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
use std::sync::OnceLock;
use tracing::{info, warn};

/// The limit the replica was started with, when it was raised.
static STARTED_WITH: OnceLock<Rlimit> = OnceLock::new();

/// Raise the open-files soft limit to the hard one (once a process).
pub(crate) fn raise() {
    let limit = getrlimit(Resource::Nofile);
    if limit.current >= limit.maximum || STARTED_WITH.get().is_some() {
        return;
    }
    let raised = Rlimit {
        current: limit.maximum,
        maximum: limit.maximum,
    };
    match setrlimit(Resource::Nofile, raised) {
        Ok(()) => {
            info!(from = ?limit.current, to = ?limit.maximum, "raised the open-files soft limit");
            let _ = STARTED_WITH.set(limit);
        }
        Err(e) => warn!(error = %e, "cannot raise the open-files soft limit"),
    }
}

/// What a sandbox's first process sets back before it execs, if the limit was raised.
pub(crate) fn for_sandbox() -> Option<Rlimit> {
    STARTED_WITH.get().copied()
}

/// Set `limit` as this process's open-files limit: a raw system call (`prlimit64`),
/// nothing allocated, so a child between fork (or vfork) and exec may make it.
pub(crate) fn restore(limit: &Rlimit) -> rustix::io::Result<()> {
    setrlimit(Resource::Nofile, *limit)
}
