//! What the provisioner's side of a sandbox's init checks and reads of what the init
//! sends: a terminal master it passes back, and its stderr.

use rustix::fd::OwnedFd;

/// What of the init's stderr is logged (it says why it could not start); the rest is
/// read and dropped.
const STDERR_LINES: usize = 20;

/// Whether `fd` is a pty master: a clone of a devpts `ptmx` (character device 5:2).
pub(super) fn is_pty_master(fd: &OwnedFd) -> bool {
    rustix::fs::fstat(fd).is_ok_and(|st| {
        rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::CharacterDevice
            && rustix::fs::major(st.st_rdev) == 5
            && rustix::fs::minor(st.st_rdev) == 2
    })
}

/// Log the first lines the init writes on its stderr (a few hundred bytes each), and
/// read and drop the rest: a command that reaches the init's stderr cannot make the
/// provisioner hold or log without bound.
pub(super) async fn log_stderr(mut stderr: tokio::net::unix::pipe::Receiver, sandbox_id: String) {
    use tokio::io::AsyncReadExt;
    let mut buf = vec![0u8; 4096];
    let mut logged = 0;
    while let Ok(n) = stderr.read(&mut buf).await {
        if n == 0 {
            break;
        }
        if logged < STDERR_LINES {
            for line in String::from_utf8_lossy(&buf[..n])
                .lines()
                .take(STDERR_LINES - logged)
            {
                logged += 1;
                tracing::warn!(%sandbox_id, line = %line.chars().take(500).collect::<String>(), "sandbox init said");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The master the init sends back is the sandbox's to choose: only a pty master is
    /// taken as one.
    #[test]
    fn only_a_pty_master_is_taken_for_one() {
        let flags = rustix::pty::OpenptFlags::RDWR | rustix::pty::OpenptFlags::NOCTTY;
        let master = rustix::pty::openpt(flags).unwrap();
        rustix::pty::unlockpt(&master).unwrap();
        let slave = rustix::pty::ioctl_tiocgptpeer(&master, flags).unwrap();
        assert!(is_pty_master(&master));
        assert!(!is_pty_master(&slave));
        let (r, _w) = rustix::pipe::pipe().unwrap();
        assert!(!is_pty_master(&r));
        let null = rustix::fs::open(
            "/dev/null",
            rustix::fs::OFlags::RDWR,
            rustix::fs::Mode::empty(),
        )
        .unwrap();
        assert!(!is_pty_master(&null));
    }
}
