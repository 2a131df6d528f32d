//! The user-namespace child of an idmapped mount ends with the provisioner that cloned
//! it, when that provisioner is killed before it told the child to go: else it waits for
//! ever, holding a copy of every descriptor the provisioner had (its gRPC port).

use super::{UsernsCtx, userns_child, vfork};
use std::{
    os::fd::{AsRawFd as _, BorrowedFd},
    time::{Duration, Instant},
};

/// Whether process `pid` has ended (gone, or a zombie not yet reaped by its new parent).
fn ended(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/status")) {
        Ok(status) => status
            .lines()
            .any(|l| l.starts_with("State:") && l.contains('Z')),
        Err(_) => true,
    }
}

/// A stand-in provisioner, forked: clones the child as `userns_mapping_to` does, waits
/// for its ready byte on `ready`, reports its pid on `report`, and dies without a word
/// to it. Exit 2: no user namespace here.
fn killed_provisioner(ready: i32, report: i32, stack: &mut [u8], ctx: &mut UsernsCtx) -> ! {
    ctx.parent = rustix::process::getpid().as_raw_pid();
    // SAFETY: a forked child making raw system calls only (its memory was made before
    // the fork); `stack` and `ctx` live until it `_exit`s.
    unsafe {
        let flags = libc::CLONE_VM | libc::CLONE_NEWUSER | libc::SIGCHLD;
        let arg = std::ptr::from_mut(ctx).cast();
        let Ok(pid) = vfork::clone_blocked(userns_child, stack, flags, arg) else {
            libc::_exit(2);
        };
        let mut byte = [0u8; 1];
        let _ = rustix::io::read(BorrowedFd::borrow_raw(ready), &mut byte);
        let _ = rustix::io::write(BorrowedFd::borrow_raw(report), &pid.to_ne_bytes());
        libc::_exit(0)
    }
}

#[test]
fn the_user_namespace_child_ends_with_a_killed_provisioner() {
    let pipe = || rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).unwrap();
    let ((ready_r, ready_w), (go_r, _go_w), (report_r, report_w)) = (pipe(), pipe(), pipe());
    let mut ctx = UsernsCtx {
        ready: ready_w.as_raw_fd(),
        go: go_r.as_raw_fd(),
        parent: 0,
    };
    let mut stack = vec![0u8; 16 * 1024];
    // SAFETY: the child runs `killed_provisioner`, raw system calls only.
    let helper = unsafe { libc::fork() };
    assert!(helper >= 0, "fork: {}", std::io::Error::last_os_error());
    if helper == 0 {
        killed_provisioner(
            ready_r.as_raw_fd(),
            report_w.as_raw_fd(),
            &mut stack,
            &mut ctx,
        );
    }
    drop(report_w);
    let mut status = 0;
    // SAFETY: waits for our own child.
    unsafe { libc::waitpid(helper, &mut status, 0) };
    if libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 2 {
        eprintln!("skipped: no user namespace can be made here");
        return;
    }
    let mut pid = [0u8; 4];
    assert_eq!(
        rustix::io::read(&report_r, &mut pid).unwrap(),
        4,
        "no child reported"
    );
    let pid = i32::from_ne_bytes(pid);
    // This test still holds the pipe end the child waits on, as another clone of the
    // provisioner's could: no end-of-file would ever free it.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !ended(pid) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let outlived = !ended(pid);
    if outlived {
        // SAFETY: the child this test made, which would wait for ever.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    assert!(
        !outlived,
        "the child outlived the provisioner that cloned it"
    );
}
