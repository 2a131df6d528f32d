//! Starting a sandbox's bubblewrap without copying the provisioner: a child made by
//! `clone(CLONE_VM | CLONE_VFORK)`, the way the C library's `posix_spawn` starts one,
//! that joins the sandbox's cgroups, drops to its uid and sets up its descriptors before
//! it execs (what `crate::local::isolation::bubblewrap::enter` and the descriptor mapping do after a fork).
//!
//! A fork copied the provisioner's page tables (its heap, 30 to 60 threads' stacks),
//! and the pages it wrote next each took a copy-on-write fault; the child then threw the
//! copy away at its exec. `perf record -a` at N = 100: about 5% of the machine's busy
//! CPU a fork.
//!
//! The child shares the provisioner's memory and runs on a stack of its own while the
//! calling thread waits (`CLONE_VFORK`) until it has exec'd or exited. It reads only
//! what was prepared before the clone, allocates nothing, and changes its credentials
//! by raw per-thread system calls (the C library's `setresuid` would signal every thread
//! of the provisioner). Every signal is blocked from before the clone until the child
//! has put every handler back to its default, so no handler of the provisioner runs in
//! it.
#![allow(unsafe_code)]

use crate::local::isolation::{bubblewrap::enter, open_files};
use rustix::{
    fd::{AsFd, AsRawFd, OwnedFd},
    process::{Gid, Pid, Signal, Uid, WaitId, WaitIdOptions},
};
use std::{
    ffi::{CString, c_char, c_int, c_void},
    io,
    sync::atomic::{AtomicI32, Ordering},
};

/// The child's stack: a few frames of system-call wrappers.
const STACK_BYTES: usize = 64 * 1024;

/// What to start, and how.
pub(crate) struct Plan {
    pub program: CString,
    /// The whole argv, `argv[0]` first.
    pub argv: Vec<CString>,
    pub env: Vec<CString>,
    /// Each descriptor here, and the number it has in the child.
    pub fds: Vec<(OwnedFd, i32)>,
    /// Cgroup join files (opened by the provisioner, `Cgroups::join_files`) the child
    /// writes itself into.
    pub procs: Vec<OwnedFd>,
    /// An overlay workspace's mount and its mount point (`crate::local::storage::overlay::attach`).
    pub attach: Option<(OwnedFd, CString)>,
    /// Binds made in the child's own mount namespace (gVisor's host-side binds).
    pub binds: Vec<enter::HostBind>,
    /// The uid and gid the child becomes (no supplementary groups).
    pub ids: Option<(u32, u32)>,
    /// The open-files limit the child sets (`crate::local::isolation::open_files`).
    pub nofile: Option<rustix::process::Rlimit>,
    /// The largest file the child and what it starts may write (`RLIMIT_FSIZE`).
    pub fsize: Option<u64>,
}

/// What the child reads: raw values only, all made before the clone.
struct Ctx<'a> {
    program: *const c_char,
    argv: *const *const c_char,
    envp: *const *const c_char,
    /// `(descriptor here, number in the child)`.
    fds: &'a [(c_int, c_int)],
    /// Above every number of `fds`: where descriptors are parked before their `dup2`.
    floor: c_int,
    /// The numbers of `fds` in the child, sorted: every other descriptor is closed at the
    /// exec.
    keep: &'a [c_int],
    procs: &'a [c_int],
    attach: Option<(rustix::fd::BorrowedFd<'a>, &'a std::ffi::CStr)>,
    binds: &'a [enter::HostBind],
    ids: Option<(u32, u32)>,
    nofile: Option<&'a rustix::process::Rlimit>,
    fsize: Option<u64>,
    /// The errno of the step that failed, set by the child before it exits.
    error: AtomicI32,
}

/// A started process, ours to wait for (through its pidfd, so a kill never reaches a
/// reused pid).
pub(crate) struct Process {
    pid: u32,
    /// `None` once reaped.
    pidfd: Option<OwnedFd>,
}

impl Process {
    pub(crate) fn id(&self) -> u32 {
        self.pid
    }

    pub(crate) fn start_kill(&self) {
        if let Some(fd) = &self.pidfd {
            let _ = rustix::process::pidfd_send_signal(fd, Signal::KILL);
        }
    }

    /// Whether it has exited (reaped here if so).
    pub(crate) fn try_wait(&mut self) -> bool {
        let Some(fd) = &self.pidfd else {
            return true;
        };
        let options = WaitIdOptions::EXITED | WaitIdOptions::NOHANG;
        // An error (not our child any more, never expected) leaves nothing to wait for.
        if !matches!(
            rustix::process::waitid(WaitId::PidFd(fd.as_fd()), options),
            Ok(None)
        ) {
            self.pidfd = None;
        }
        self.pidfd.is_none()
    }
}

impl Drop for Process {
    /// Killed and reaped, as `kill_on_drop` does: no zombie is left behind.
    fn drop(&mut self) {
        if self.try_wait() {
            return;
        }
        self.start_kill();
        let Some(pidfd) = self.pidfd.take() else {
            return;
        };
        let reap = move || {
            let _ = rustix::process::waitid(WaitId::PidFd(pidfd.as_fd()), WaitIdOptions::EXITED);
        };
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => drop(rt.spawn_blocking(reap)),
            Err(_) => reap(),
        }
    }
}

/// Start `plan`. An error names the step that failed in the child, with its errno.
pub(crate) fn spawn(plan: Plan) -> io::Result<Process> {
    let argv = null_terminated(&plan.argv);
    let envp = null_terminated(&plan.env);
    let fds: Vec<(c_int, c_int)> = plan
        .fds
        .iter()
        .map(|(fd, n)| (fd.as_raw_fd(), *n))
        .collect();
    let procs: Vec<c_int> = plan.procs.iter().map(AsRawFd::as_raw_fd).collect();
    let floor = fds.iter().map(|(_, n)| *n + 1).max().unwrap_or(3).max(3);
    let mut keep: Vec<c_int> = fds.iter().map(|(_, n)| *n).collect();
    keep.sort_unstable();
    keep.dedup();
    let ctx = Ctx {
        program: plan.program.as_ptr(),
        argv: argv.as_ptr(),
        envp: envp.as_ptr(),
        fds: &fds,
        floor,
        keep: &keep,
        procs: &procs,
        attach: plan
            .attach
            .as_ref()
            .map(|(fd, target)| (fd.as_fd(), target.as_c_str())),
        binds: &plan.binds,
        ids: plan.ids,
        nofile: plan.nofile.as_ref(),
        fsize: plan.fsize,
        error: AtomicI32::new(0),
    };
    let mut stack = vec![0u8; STACK_BYTES];
    // SAFETY: `stack` is ours and alive until `clone_blocked` returns, and so is `ctx`:
    // CLONE_VFORK returns once the child has exec'd or exited. The child keeps to what
    // `child` documents.
    let pid = unsafe {
        clone_blocked(
            child,
            &mut stack,
            libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
            std::ptr::from_ref(&ctx).cast_mut().cast(),
        )?
    };
    drop(stack);
    let pid_u32 = u32::try_from(pid).map_err(|_| io::Error::other("clone gave no pid"))?;
    let child_pid = Pid::from_raw(pid).ok_or_else(|| io::Error::other("clone gave no pid"))?;
    exec_failed(ctx.error.load(Ordering::Acquire), child_pid)?;
    Ok(Process {
        pid: pid_u32,
        pidfd: Some(pidfd_of(child_pid)?),
    })
}

/// `Err` when the child reported `error` (it exited without exec'ing): reaped, and why.
fn exec_failed(error: i32, child_pid: Pid) -> io::Result<()> {
    if error == 0 {
        return Ok(());
    }
    let _ = rustix::process::waitpid(Some(child_pid), rustix::process::WaitOptions::empty());
    let (step, errno) = (error >> 16, error & 0xffff);
    let what = STEPS.get(step as usize).copied().unwrap_or("start");
    let e = io::Error::from_raw_os_error(errno);
    Err(io::Error::new(e.kind(), format!("{what}: {e}")))
}

/// A pidfd of the started child; without one, the child is killed and reaped.
fn pidfd_of(child_pid: Pid) -> io::Result<OwnedFd> {
    match rustix::process::pidfd_open(child_pid, rustix::process::PidfdFlags::empty()) {
        Ok(fd) => Ok(fd),
        Err(e) => {
            let _ = rustix::process::kill_process(child_pid, Signal::KILL);
            let _ =
                rustix::process::waitpid(Some(child_pid), rustix::process::WaitOptions::empty());
            Err(e.into())
        }
    }
}

/// `clone(flags)` of a child that runs `child(arg)` on `stack`, with every signal
/// blocked from before the clone to after it (the child starts with them blocked, so no
/// handler of the provisioner runs on its stack); the caller's mask is put back. The
/// child's pid.
///
/// # Safety
/// `stack` and what `arg` points to must outlive the child's use of them, and `child`
/// may only make raw system calls (with `CLONE_VM` it shares the caller's memory).
pub(crate) unsafe fn clone_blocked(
    child: extern "C" fn(*mut c_void) -> c_int,
    stack: &mut [u8],
    flags: c_int,
    arg: *mut c_void,
) -> io::Result<c_int> {
    // The top, 16-byte aligned as the ABI wants at a call.
    let top = (stack.as_mut_ptr() as usize + stack.len()) & !15;
    // SAFETY: `sigfillset`/`pthread_sigmask` on local sets; `clone` as the caller vouches.
    unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
        let pid = libc::clone(child, top as *mut c_void, flags, arg);
        let clone_error = io::Error::last_os_error();
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
        if pid == -1 {
            return Err(clone_error);
        }
        Ok(pid)
    }
}

/// `strings` as execve takes them: pointers, then a null one.
fn null_terminated(strings: &[CString]) -> Vec<*const c_char> {
    strings
        .iter()
        .map(|s| s.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect()
}

/// What the child was doing when it failed, by the step number it reports.
const STEPS: &[&str] = &[
    "start",
    "reset signal handlers",
    "join the sandbox's cgroup",
    "drop to the sandbox's uid",
    "map descriptors",
    "set the open-files limit",
    "unblock signals",
    "exec",
    "mount the workspace and binds",
    "close inherited descriptors",
];

/// A step of the child that failed: its number in [`STEPS`], and its errno.
type Failed = (i32, i32);

/// The child: raw system calls on `Ctx`'s values, then exec. Never returns.
extern "C" fn child(arg: *mut c_void) -> c_int {
    // SAFETY: `arg` is the `Ctx` the parent keeps alive while it waits for this child.
    let ctx = unsafe { &*arg.cast::<Ctx<'_>>() };
    // SAFETY: the steps run in this child alone, on values the parent prepared.
    let Err((step, errno)) = unsafe { enter_and_exec(ctx) };
    ctx.error
        .store((step << 16) | (errno & 0xffff), Ordering::Release);
    // SAFETY: ends this process (its own thread group) only.
    unsafe { libc::_exit(127) }
}

/// The calling thread's errno (the waiting parent's: see [`enter_and_exec`]).
fn errno() -> i32 {
    // SAFETY: the calling thread's errno location.
    unsafe { *libc::__errno_location() }
}

/// The child's steps, in order, then the exec; returns only with the step that failed.
///
/// # Safety
/// Only in the child [`clone_blocked`] starts: system calls on values prepared by the
/// parent; no allocation, no lock. `errno` written by the C library's wrappers is the
/// waiting parent thread's, as in posix_spawn's child.
unsafe fn enter_and_exec(ctx: &Ctx<'_>) -> Result<std::convert::Infallible, Failed> {
    // SAFETY: as this function's contract says.
    unsafe {
        default_handlers()?;
        // "0" moves the writer itself (this child has one thread); checked with the
        // opener's rights.
        for &fd in ctx.procs {
            if libc::write(fd, b"0".as_ptr().cast(), 1) != 1 {
                return Err((2, errno()));
            }
        }
        // As root, before the uid drop: a mount namespace of its own, the workspace and
        // host-side binds in it.
        enter::own_mounts(ctx.attach, ctx.binds).map_err(|e| (8, e.raw_os_error()))?;
        if let Some((uid, gid)) = ctx.ids {
            // rustix's raw system calls: this thread only.
            let (uid, gid) = (Uid::from_raw(uid), Gid::from_raw(gid));
            rustix::thread::set_thread_groups(&[])
                .and_then(|()| rustix::thread::set_thread_res_gid(gid, gid, gid))
                .and_then(|()| rustix::thread::set_thread_res_uid(uid, uid, uid))
                .map_err(|e| (3, e.raw_os_error()))?;
        }
        place_descriptors(ctx)?;
        // What the provisioner inherited without close-on-exec stays out of the sandbox.
        enter::only_keep(ctx.keep).map_err(|e| (9, e.raw_os_error().unwrap_or(libc::EBADF)))?;
        // After the descriptors are in place: parking them needs free numbers above the
        // others, which a lowered limit could leave none of.
        if let Some(limit) = ctx.nofile {
            open_files::restore(limit).map_err(|e| (5, e.raw_os_error()))?;
        }
        if let Some(bytes) = ctx.fsize {
            enter::restrict_file_size(bytes).map_err(|e| (10, e.raw_os_error()))?;
        }
        let mut empty: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut empty);
        if libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut()) != 0 {
            return Err((6, errno()));
        }
        libc::execve(ctx.program, ctx.argv, ctx.envp);
        Err((7, errno()))
    }
}

/// Handlers of the provisioner's (and an ignored SIGPIPE, as the standard library's
/// spawn does) back to their defaults; signals stay blocked meanwhile.
///
/// # Safety
/// As [`enter_and_exec`].
unsafe fn default_handlers() -> Result<(), Failed> {
    // SAFETY: `sigaction` on zeroed structs of this thread's, in the child.
    unsafe {
        for sig in 1..=libc::SIGRTMAX() {
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(sig, std::ptr::null(), &mut old) != 0 {
                continue; // SIGKILL, SIGSTOP, the C library's own
            }
            let handled = old.sa_sigaction != libc::SIG_DFL && old.sa_sigaction != libc::SIG_IGN;
            if handled || sig == libc::SIGPIPE {
                let mut dfl: libc::sigaction = std::mem::zeroed();
                dfl.sa_sigaction = libc::SIG_DFL;
                if libc::sigaction(sig, &dfl, std::ptr::null_mut()) != 0 {
                    return Err((1, errno()));
                }
            }
        }
    }
    Ok(())
}

/// Each of `ctx.fds` parked above every target (close-on-exec), then put in place: a
/// target that is another's source is not clobbered before it is read.
///
/// # Safety
/// As [`enter_and_exec`].
unsafe fn place_descriptors(ctx: &Ctx<'_>) -> Result<(), Failed> {
    let mut parked = [0 as c_int; 16];
    if ctx.fds.len() > parked.len() {
        return Err((4, libc::E2BIG));
    }
    // SAFETY: `fcntl` and `dup2` on the parent's descriptors, in the child.
    unsafe {
        for (slot, &(fd, _)) in parked.iter_mut().zip(ctx.fds) {
            *slot = libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, ctx.floor);
            if *slot < 0 {
                return Err((4, errno()));
            }
        }
        for (&from, &(_, to)) in parked.iter().zip(ctx.fds) {
            if libc::dup2(from, to) < 0 {
                return Err((4, errno()));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
#[path = "vfork_tests.rs"]
mod tests;
