//! A sandbox's first process enters its cgroups and drops to its uid between fork and
//! exec, before it becomes bubblewrap: every process of the sandbox is in its cgroups and
//! runs as its uid from its first instruction, with no helper process to start. (This was
//! a shell writing `cgroup.procs` and then `setpriv`: two process start-ups, about 2 ms of
//! loader work, each time a sandbox started.)
//!
//! One of the crate's three `unsafe` places (the others: `crate::local::vfork`, the
//! same steps for a sandbox's init, and `init/ended.rs`, waitid's pid): a `pre_exec`
//! hook. It runs in the forked child, where
//! only async-signal-safe calls are allowed; it makes raw system calls (rustix's Linux
//! backend: `write`, `setgroups`, `setresgid`, `setresuid`, `prlimit64`, and an overlay's
//! `unshare`, `mount`, `open_tree` and `move_mount`) on descriptors opened before
//! the fork, and allocates nothing.
#![allow(unsafe_code)]

use rustix::{
    fd::OwnedFd,
    fs::{Mode, OFlags},
    process::{Gid, Uid},
};
use std::path::PathBuf;
use tokio::process::Command;

/// The `cgroup.procs` files, opened for writing (as the provisioner): a missing cgroup
/// fails here, naming its path.
pub fn open_procs(cgroup_procs: &[PathBuf]) -> std::io::Result<Vec<OwnedFd>> {
    cgroup_procs
        .iter()
        .map(|p| {
            rustix::fs::open(p, OFlags::WRONLY | OFlags::CLOEXEC, Mode::empty())
                .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", p.display())))
        })
        .collect()
}

/// Make `cmd`'s process join the cgroups whose `cgroup.procs` files are `cgroup_procs`
/// (as the provisioner), then become `uid` (its gid too, no supplementary groups).
///
/// The files are opened here, in the provisioner: a missing cgroup fails now, with its
/// path. A write the kernel refuses fails the spawn with its error.
/// With `attach`, an overlay workspace's mount is put on its mount point in a mount
/// namespace of the process's own first (`crate::local::overlay::attach`).
pub fn set(
    cmd: &mut Command,
    cgroup_procs: &[PathBuf],
    attach: Option<(OwnedFd, std::ffi::CString)>,
    uid: Option<u32>,
) -> std::io::Result<()> {
    if cgroup_procs.is_empty() && uid.is_none() && attach.is_none() {
        return Ok(());
    }
    let procs = open_procs(cgroup_procs)?;
    let ids = uid.map(|u| (Uid::from_raw(u), Gid::from_raw(u)));
    // SAFETY: the hook only makes system calls on values it owns (no allocation, no lock,
    // no libc state), which is what a forked child of a multi-threaded process may do.
    // The per-thread set*id calls are what we want there: the child has one thread.
    unsafe {
        cmd.pre_exec(move || {
            // "0" moves the writing process itself (cgroup v2), checked with the
            // opener's rights: the provisioner's.
            for fd in &procs {
                rustix::io::write(fd, b"0")?;
            }
            if let Some((mount, target)) = &attach {
                crate::local::overlay::attach(rustix::fd::AsFd::as_fd(mount), target)?;
            }
            if let Some((uid, gid)) = ids {
                rustix::thread::set_thread_groups(&[])?;
                rustix::thread::set_thread_res_gid(gid, gid, gid)?;
                rustix::thread::set_thread_res_uid(uid, uid, uid)?;
            }
            Ok(())
        });
    }
    Ok(())
}

/// Give `cmd`'s process the open-files limit the replica was started with
/// (`crate::local::open_files`), if it was raised. Add it after every hook that needs
/// free descriptor numbers (the descriptor mapping's): it runs after them.
pub fn set_open_files_limit(cmd: &mut Command) {
    let Some(limit) = crate::local::open_files::for_sandbox() else {
        return;
    };
    // SAFETY: one raw system call (`prlimit64`) on a value the hook owns, as above.
    unsafe {
        cmd.pre_exec(move || Ok(crate::local::open_files::restore(&limit)?));
    }
}
