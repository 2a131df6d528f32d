//! Children started without a copy of the provisioner: the descriptors they are given
//! land on their numbers, their signals start clean, and a program that cannot be
//! started is an error naming the step.

use super::{Plan, spawn};
use std::{ffi::CString, io::Read, os::fd::OwnedFd};

fn c(s: &str) -> CString {
    CString::new(s).unwrap()
}

fn null() -> OwnedFd {
    std::fs::File::open("/dev/null").unwrap().into()
}

fn plan(argv: &[&str], fds: Vec<(OwnedFd, i32)>) -> Plan {
    Plan {
        program: c(argv[0]),
        argv: argv.iter().map(|a| c(a)).collect(),
        env: vec![c("PATH=/usr/bin:/bin")],
        fds,
        procs: Vec::new(),
        attach: None,
        binds: Vec::new(),
        ids: None,
        nofile: None,
        fsize: None,
    }
}

#[test]
fn a_program_that_cannot_be_started_is_an_error_naming_the_step() {
    let err = spawn(plan(&["/no/such/program"], vec![(null(), 0)]))
        .err()
        .expect("no such program");
    assert!(err.to_string().starts_with("exec: "), "{err}");
    assert_eq!(err.kind(), std::io::ErrorKind::NotFound);
}

/// Each descriptor lands on its number (a target that is another's source
/// included), nothing else of the parent is open in the child, and the child starts
/// with no signal blocked or ignored (the provisioner ignores SIGPIPE).
#[test]
fn descriptors_land_on_their_numbers_and_signals_start_clean() {
    let (mut out_r, out_w) = std::io::pipe().unwrap();
    let (mut a_r, a_w) = std::io::pipe().unwrap();
    let (mut b_r, b_w) = std::io::pipe().unwrap();
    let _leaked = not_close_on_exec(null());
    let script =
        "echo a >&3; echo b >&4; grep -E '^Sig(Blk|Ign)' /proc/self/status; ls /proc/self/fd";
    let fds = vec![
        (null(), 0),
        (out_w.into(), 1),
        (null(), 2),
        (a_w.into(), 3),
        (b_w.into(), 4),
    ];
    let mut child = spawn(plan(&["/bin/sh", "-c", script], fds)).unwrap();
    let mut out = String::new();
    out_r.read_to_string(&mut out).unwrap();
    let (mut a, mut b) = (String::new(), String::new());
    a_r.read_to_string(&mut a).unwrap();
    b_r.read_to_string(&mut b).unwrap();
    assert_eq!((a.as_str(), b.as_str()), ("a\n", "b\n"));
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "SigBlk:\t0000000000000000", "{out}");
    // Ignored as here (what a fork and exec keeps), but SIGPIPE.
    assert_eq!(
        lines[1],
        format!("SigIgn:\t{:016x}", ignored_here() & !(1 << 12))
    );
    // ls's own descriptor of /proc/self/fd is the sixth. Nothing else: not even what
    // this test process holds without close-on-exec (from whoever started it, and a
    // descriptor left open here for the purpose).
    assert!(inherited_here().iter().any(|n| *n > 5), "nothing to leak");
    let expected: Vec<String> = (0..=5).map(|n| n.to_string()).collect();
    let mut got: Vec<String> = lines[2..].iter().map(|s| (*s).to_owned()).collect();
    got.sort();
    assert_eq!(got, expected, "{out}");
    for _ in 0..500 {
        if child.try_wait() {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    panic!("the child was never reaped");
}

/// `fd` as a descriptor a child would inherit.
fn not_close_on_exec(fd: OwnedFd) -> OwnedFd {
    let fd = rustix::io::fcntl_dupfd_cloexec(&fd, 100).unwrap();
    rustix::io::fcntl_setfd(&fd, rustix::io::FdFlags::empty()).unwrap();
    fd
}

fn ignored_here() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("SigIgn:")).unwrap();
    u64::from_str_radix(line.trim_start_matches("SigIgn:").trim(), 16).unwrap()
}

/// This process's descriptors without close-on-exec.
fn inherited_here() -> Vec<i32> {
    std::fs::read_dir("/proc/self/fdinfo")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|n| {
            let info =
                std::fs::read_to_string(format!("/proc/self/fdinfo/{n}")).unwrap_or_default();
            info.lines()
                .find_map(|l| l.strip_prefix("flags:"))
                .and_then(|f| u32::from_str_radix(f.trim(), 8).ok())
                .is_some_and(|f| f & 0o2_000_000 == 0)
        })
        .collect()
}
