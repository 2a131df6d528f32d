//! A sandbox's first process enters its cgroups and drops to its uid between fork and
//! exec, before it becomes bubblewrap: every process of the sandbox is in its cgroups and
//! runs as its uid from its first instruction, with no helper process to start. (This was
//! a shell writing `cgroup.procs` and then `setpriv`: two process start-ups, about 2 ms of
//! loader work, each time a sandbox started.)
//!
//! One of the crate's few `unsafe` places (the others: `super::vfork`, the same steps
//! for a sandbox's init; `isolation/init/ended.rs`, waitid's pid; `storage/overlay.rs`,
//! the idmap's user namespace; `storage/image/jail.rs`, the unpack thread's jail): a
//! `pre_exec` hook, and [`attach`], which the hook and `vfork`'s child call. It runs in
//! the forked child, where only async-signal-safe calls are allowed; it makes raw system
//! calls (rustix's Linux backend: `write`, `setgroups`, `setresgid`, `setresuid`,
//! `prlimit64`, and an overlay's or gVisor's binds' `unshare`, `mount`, `open_tree` and
//! `move_mount`;
//! `close_range`) on descriptors opened before the fork, and allocates nothing.
#![allow(unsafe_code)]

use crate::local::isolation::open_files;
use rustix::{
    fd::{BorrowedFd, OwnedFd},
    fs::{Mode, OFlags},
    mount::{MountFlags, MountPropagationFlags, MoveMountFlags, OpenTreeFlags},
    process::{Gid, Uid},
};
use std::{
    ffi::{CStr, CString},
    path::PathBuf,
};
use tokio::process::Command;

/// The cgroup files a process joins through (`Cgroups::join_files`), opened for writing
/// (as the provisioner): a missing cgroup fails here, naming its path.
pub fn open_joins(cgroup_joins: &[PathBuf]) -> std::io::Result<Vec<OwnedFd>> {
    cgroup_joins
        .iter()
        .map(|p| {
            rustix::fs::open(p, OFlags::WRONLY | OFlags::CLOEXEC, Mode::empty())
                .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", p.display())))
        })
        .collect()
}

/// Make `cmd`'s process join the cgroups whose join files are `cgroup_joins`
/// (as the provisioner), then become `uid` (its gid too, no supplementary groups).
///
/// The files are opened here, in the provisioner: a missing cgroup fails now, with its
/// path. A write the kernel refuses fails the spawn with its error.
/// With `attach`, an overlay workspace's mount is put on its mount point in a mount
/// namespace of the process's own first (`crate::local::storage::overlay::attach`).
pub fn set(
    cmd: &mut Command,
    cgroup_joins: &[PathBuf],
    attach: Option<(OwnedFd, std::ffi::CString)>,
    uid: Option<u32>,
) -> std::io::Result<()> {
    if cgroup_joins.is_empty() && uid.is_none() && attach.is_none() {
        return Ok(());
    }
    let procs = open_joins(cgroup_joins)?;
    let ids = uid.map(|u| (Uid::from_raw(u), Gid::from_raw(u)));
    // SAFETY: the hook only makes system calls on values it owns (no allocation, no lock,
    // no libc state), which is what a forked child of a multi-threaded process may do.
    // The per-thread set*id calls are what we want there: the child has one thread.
    unsafe {
        cmd.pre_exec(move || {
            // "0" moves the writer itself (the forked child has one thread), checked
            // with the opener's rights: the provisioner's.
            for fd in &procs {
                rustix::io::write(fd, b"0")?;
            }
            if let Some((mount, target)) = &attach {
                self::attach(rustix::fd::AsFd::as_fd(mount), target)?;
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

/// Mark every descriptor of the calling process close-on-exec but those numbered in
/// `keep` (sorted): what the provisioner inherited from whoever started it (a
/// supervisor's pipe, a log file) and did not open close-on-exec itself never reaches
/// bubblewrap, nor so the sandbox. Close-on-exec rather than closed: a `std` child
/// reports a failed exec on a close-on-exec pipe of its own. Raw system calls only:
/// safe in a forked or `CLONE_VFORK` child.
pub(crate) fn only_keep(keep: &[i32]) -> std::io::Result<()> {
    let mut first = 0u32;
    for &fd in keep {
        let Ok(fd) = u32::try_from(fd) else { continue };
        if fd > first {
            cloexec_range(first, fd - 1)?;
        }
        first = first.max(fd.saturating_add(1));
    }
    cloexec_range(first, u32::MAX)
}

/// `close_range(first, last, CLOSE_RANGE_CLOEXEC)`, or each number up to the open-files
/// limit on a kernel older than 5.11, which lacks it.
fn cloexec_range(first: u32, last: u32) -> std::io::Result<()> {
    // SAFETY: a system call on numbers only; it changes no memory of ours.
    let done = unsafe {
        libc::syscall(
            libc::SYS_close_range,
            first,
            last,
            libc::CLOSE_RANGE_CLOEXEC,
        )
    };
    if done == 0 {
        return Ok(());
    }
    let e = std::io::Error::last_os_error();
    if !matches!(e.raw_os_error(), Some(libc::ENOSYS | libc::EINVAL)) {
        return Err(e);
    }
    let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile)
        .current
        .unwrap_or(1 << 20);
    let end = u64::from(last).min(limit.saturating_sub(1));
    for fd in u64::from(first)..=end {
        let Ok(fd) = i32::try_from(fd) else { break };
        // SAFETY: as above; a number not open answers EBADF, which is what we want.
        unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
    }
    Ok(())
}

/// Let `cmd`'s process keep only its stdin, stdout, stderr and the descriptors mapped to
/// `mapped` across its exec ([`only_keep`]). Add it after the descriptor mapping's hook.
pub fn keep_only_mapped(cmd: &mut Command, mapped: &[i32]) {
    let mut keep: Vec<i32> = [0, 1, 2].iter().chain(mapped).copied().collect();
    keep.sort_unstable();
    keep.dedup();
    // SAFETY: raw system calls on numbers the hook owns, as above.
    unsafe {
        cmd.pre_exec(move || only_keep(&keep));
    }
}

/// Give `cmd`'s process the open-files limit the replica was started with
/// (`crate::local::isolation::open_files`), if it was raised. Add it after every hook that needs
/// free descriptor numbers (the descriptor mapping's): it runs after them.
pub fn set_open_files_limit(cmd: &mut Command) {
    let Some(limit) = open_files::for_sandbox() else {
        return;
    };
    // SAFETY: one raw system call (`prlimit64`) on a value the hook owns, as above.
    unsafe {
        cmd.pre_exec(move || Ok(open_files::restore(&limit)?));
    }
}

/// Give `cmd`'s process (and everything it starts) `RLIMIT_FSIZE` = `bytes`, if any: a
/// write or `fallocate` that would make a file larger fails inside the sandbox (with
/// `SIGXFSZ`, or `EFBIG` where it is handled).
pub fn set_file_size_limit(cmd: &mut Command, bytes: Option<u64>) {
    let Some(bytes) = bytes else {
        return;
    };
    // SAFETY: one raw system call (`prlimit64`) on a value the hook owns, as above.
    unsafe {
        cmd.pre_exec(move || Ok(restrict_file_size(bytes)?));
    }
}

/// Set this process's `RLIMIT_FSIZE` (soft and hard) to `bytes`: a raw system call,
/// nothing allocated, so a child between fork (or vfork) and exec may make it.
pub fn restrict_file_size(bytes: u64) -> rustix::io::Result<()> {
    let limit = rustix::process::Rlimit {
        current: Some(bytes),
        maximum: Some(bytes),
    };
    rustix::process::setrlimit(rustix::process::Resource::Fsize, limit)
}

/// A bind the launching child makes in its own mount namespace (gVisor's host-side
/// binds, `crate::local::isolation::gvisor::bundle::Bind::on_host`): `source` on
/// `target`, recursive, nosuid and nodev, read-only unless `writable`. Both paths are
/// the host's: `target` a mount point the provisioner made in a directory of its own.
pub(crate) struct HostBind {
    pub source: CString,
    pub target: CString,
    pub writable: bool,
}

/// In a child about to start a sandbox's runtime (as root, before it drops to the
/// sandbox's uid): a mount namespace of its own, nothing in it propagated back to the
/// host's, with `attach` (the overlay workspace, [`attach`]) and `binds` mounted in it.
/// Raw system calls on values made before the clone, nothing allocated.
pub(crate) fn own_mounts(
    attach: Option<(BorrowedFd<'_>, &CStr)>,
    binds: &[HostBind],
) -> rustix::io::Result<()> {
    if attach.is_none() && binds.is_empty() {
        return Ok(());
    }
    // SAFETY: the calling process has one thread (a child); CLONE_NEWNS leaves its
    // descriptors alone.
    unsafe { rustix::thread::unshare_unsafe(rustix::thread::UnshareFlags::NEWNS)? };
    // Nothing mounted here reaches the host's namespace.
    rustix::mount::mount_change(
        c"/",
        MountPropagationFlags::DOWNSTREAM | MountPropagationFlags::REC,
    )?;
    for b in binds {
        rustix::mount::mount_bind_recursive(b.source.as_c_str(), b.target.as_c_str())?;
        let mut flags = MountFlags::BIND | MountFlags::NOSUID | MountFlags::NODEV;
        if !b.writable {
            flags |= MountFlags::RDONLY;
        }
        rustix::mount::mount_remount(b.target.as_c_str(), flags, c"")?;
    }
    match attach {
        Some((mount, target)) => move_clone(mount, target),
        None => Ok(()),
    }
}

/// In a child about to become a sandbox's bubblewrap (as root, before it drops to the
/// sandbox's uid): a mount namespace of its own, and a clone of `mount` on `target` (the
/// sandbox's `workspace` directory), which bubblewrap then binds at `/workspace`. Raw
/// system calls on values made before the fork or clone, nothing allocated: safe in a
/// forked or vfork child.
pub(crate) fn attach(mount: BorrowedFd<'_>, target: &CStr) -> rustix::io::Result<()> {
    own_mounts(Some((mount, target)), &[])
}

/// A clone of `mount` on `target`, in the calling process's mount namespace.
fn move_clone(mount: BorrowedFd<'_>, target: &CStr) -> rustix::io::Result<()> {
    let clone = rustix::mount::open_tree(
        mount,
        c"",
        OpenTreeFlags::OPEN_TREE_CLONE
            | OpenTreeFlags::OPEN_TREE_CLOEXEC
            | OpenTreeFlags::AT_EMPTY_PATH,
    )?;
    rustix::mount::move_mount(
        &clone,
        c"",
        rustix::fs::CWD,
        target,
        MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH,
    )
}
