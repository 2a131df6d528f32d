//! Which child of the init has ended, without reaping it: `waitid` with `WNOWAIT` and
//! the pid it reports (`siginfo_t.si_pid`), which rustix's `waitid` does not return.
//! The reaper kills what is left of a command while its leader's zombie still holds the
//! pid, and so the group's id: a reaped leader alone in its group frees the number.
#![allow(unsafe_code)]

use std::io;

/// The pid of a child that has ended and is not reaped yet; `None` when none has.
pub(super) fn ended_child() -> io::Result<Option<i32>> {
    // SAFETY: siginfo_t is plain data, all-zero is a valid value of it.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: `info` is a valid, writable siginfo_t for the call's duration.
    let r = unsafe {
        libc::waitid(
            libc::P_ALL,
            0,
            &raw mut info,
            libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: filled in by waitid for a child's state change (SIGCHLD); still zero
    // (zeroed above) when WNOHANG found none.
    let pid = unsafe { info.si_pid() };
    Ok((pid != 0).then_some(pid))
}

#[cfg(test)]
mod tests {
    #[test]
    fn an_ended_child_is_named_and_left_to_reap() {
        let child = std::process::Command::new("true").spawn().unwrap();
        let pid = i32::try_from(child.id()).unwrap();
        let found = (0..500).find_map(|_| {
            std::thread::sleep(std::time::Duration::from_millis(10));
            super::ended_child().unwrap()
        });
        assert_eq!(found, Some(pid));
        // Still there to reap, with its status.
        let mut child = child;
        assert!(child.wait().unwrap().success());
    }
}
