//! The sandbox's terminal side of a PTY command (`--ctty -- argv`): a session of its own
//! with stdin as its controlling terminal, then the command in its place; and the exit
//! code of a command that could not start, as shells give it.

use std::{io, os::unix::process::CommandExt as _, process::Command, process::ExitCode};

pub(super) fn not_started(e: &io::Error) -> i32 {
    match e.kind() {
        io::ErrorKind::NotFound => 127,
        io::ErrorKind::PermissionDenied => 126,
        _ => 125,
    }
}

/// `setsid(2)`, its result not taken for a pid: gVisor's kernel (runsc 20221219)
/// answers 0 where Linux answers the new session's id, which rustix's wrapper would
/// make a `Pid` of (a zero one: a panic in a debug build, undefined behaviour otherwise).
#[allow(unsafe_code)]
fn new_session() -> io::Result<()> {
    // SAFETY: setsid takes no argument and touches no memory of this process's.
    if unsafe { libc::setsid() } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `--ctty -- argv`: a session of its own whose controlling terminal is stdin, then the
/// command in this process's place (so its exit is the command's own).
pub fn exec_on_ctty(argv: &[String]) -> ExitCode {
    let Some(program) = argv.first() else {
        return ExitCode::from(125);
    };
    let _ = new_session();
    if let Err(e) = rustix::process::ioctl_tiocsctty(io::stdin()) {
        eprintln!("forkyard: no controlling terminal: {e}");
    }
    let e = Command::new(program).args(&argv[1..]).exec();
    eprintln!("forkyard: {program}: {e}");
    ExitCode::from(u8::try_from(not_started(&e)).unwrap_or(125))
}
