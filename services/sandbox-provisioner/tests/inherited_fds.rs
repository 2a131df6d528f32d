//! Descriptors the provisioner inherited from whoever started it (a supervisor's pipe at
//! 251, a log file at 10) never reach a sandbox: a sandboxed command holds its stdin,
//! stdout and stderr and nothing else, under the sandbox's init and under a bubblewrap
//! of its own alike. A test binary of its own: the descriptors are left open in this
//! process for the whole run.

mod common;

use common::{fixture, fixture_with};
use std::os::fd::{IntoRawFd, OwnedFd, RawFd};

/// Host descriptors without close-on-exec, as a process starting the provisioner leaves
/// them: a pipe's ends (from 251) and a file (from 10). Their numbers; kept open for the
/// rest of the run.
fn inherited() -> &'static [RawFd] {
    static FDS: std::sync::OnceLock<Vec<RawFd>> = std::sync::OnceLock::new();
    FDS.get_or_init(|| {
        let (r, w) = std::io::pipe().unwrap();
        let file = std::fs::File::open("/etc/hostname").unwrap();
        let ends: [(OwnedFd, RawFd); 3] = [(r.into(), 251), (w.into(), 251), (file.into(), 10)];
        ends.into_iter()
            .map(|(fd, from)| {
                let fd = rustix::io::fcntl_dupfd_cloexec(&fd, from).unwrap();
                rustix::io::fcntl_setfd(&fd, rustix::io::FdFlags::empty()).unwrap();
                fd.into_raw_fd()
            })
            .collect()
    })
}

/// The descriptors `ls /proc/self/fd` sees in the sandbox, without its own (the
/// directory it reads).
async fn sandboxed_fds(f: &common::Fixture) -> Vec<String> {
    let sbx = f.create().await;
    let out = f.sh(&sbx.id, "ls -l /proc/self/fd").await;
    assert_eq!(out.exit_code, 0, "{}{}", out.stdout, out.stderr);
    out.stdout
        .lines()
        .filter(|l| l.contains(" -> ") && !l.contains("/proc/"))
        .map(|l| l.to_owned())
        .collect()
}

/// What a sandboxed command may hold: its stdin, stdout and stderr.
fn only_stdio(fds: &[String]) {
    let numbers: Vec<&str> = fds
        .iter()
        .filter_map(|l| l.split(" -> ").next()?.rsplit(' ').next())
        .collect();
    assert_eq!(numbers, ["0", "1", "2"], "{fds:#?}");
}

#[tokio::test]
async fn a_command_under_the_sandboxs_init_holds_only_its_stdio() {
    assert_eq!(inherited().len(), 3);
    only_stdio(&sandboxed_fds(&fixture().await).await);
}

#[tokio::test]
async fn a_command_in_a_bubblewrap_of_its_own_holds_only_its_stdio() {
    assert_eq!(inherited().len(), 3);
    let f = fixture_with(|_, c| c.sandbox_init = false).await;
    only_stdio(&sandboxed_fds(&f).await);
}
