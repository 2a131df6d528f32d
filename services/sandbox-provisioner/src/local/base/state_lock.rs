//! One provisioner per state directory. Two on one directory (two replicas given the
//! same host path, a restart while the old process still drains) would each take the
//! other's sandboxes over at start: kill their processes, re-own their workspaces, and
//! at exit remove the other's cgroups. An exclusive `flock` on `<state>/provisioner.lock`,
//! held for the provisioner's lifetime, rules that out; the kernel drops it with the
//! process, however it ends, so a crash never leaves it behind.

use rustix::fs::{FlockOperation, Mode, OFlags};
use std::{
    io::{self, Write},
    os::fd::OwnedFd,
    path::Path,
    time::{Duration, Instant},
};

pub(crate) const LOCK_FILE: &str = "provisioner.lock";

/// Held while it lives.
#[derive(Debug)]
pub(crate) struct StateLock {
    _fd: OwnedFd,
}

impl StateLock {
    /// Take the lock, waiting up to `wait` for a previous holder to go (a process still
    /// draining, a dropped instance whose last reference is a moment from going).
    pub(crate) async fn acquire(state_dir: &Path, wait: Duration) -> io::Result<Self> {
        let path = state_dir.join(LOCK_FILE);
        // Close-on-exec: the sandboxes' processes must not hold it past the provisioner.
        let fd = rustix::fs::open(
            &path,
            OFlags::RDWR | OFlags::CREATE | OFlags::CLOEXEC | OFlags::NOFOLLOW,
            Mode::from_raw_mode(0o600),
        )?;
        let deadline = Instant::now() + wait;
        loop {
            match rustix::fs::flock(&fd, FlockOperation::NonBlockingLockExclusive) {
                Ok(()) => break,
                Err(rustix::io::Errno::WOULDBLOCK) if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(rustix::io::Errno::WOULDBLOCK) => {
                    let holder = std::fs::read_to_string(&path).unwrap_or_default();
                    return Err(io::Error::other(format!(
                        "in use by another sandbox provisioner ({}); each replica needs a state directory of its own",
                        holder_of(&holder)
                    )));
                }
                Err(e) => return Err(e.into()),
            }
        }
        // Who holds it, for the next one's error.
        rustix::fs::ftruncate(&fd, 0)?;
        let mut file = std::fs::File::from(fd);
        write!(
            file,
            "pid {} on {}",
            std::process::id(),
            rustix::system::uname().nodename().to_string_lossy()
        )?;
        Ok(Self { _fd: file.into() })
    }
}

fn holder_of(contents: &str) -> &str {
    match contents.trim() {
        "" => "holder unknown",
        who => who,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_second_holder_is_refused_until_the_first_goes() {
        let tmp = tempfile::tempdir().unwrap();
        let first = StateLock::acquire(tmp.path(), Duration::ZERO)
            .await
            .unwrap();
        let err = StateLock::acquire(tmp.path(), Duration::from_millis(120))
            .await
            .unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains("in use by another sandbox provisioner"),
            "{msg}"
        );
        assert!(
            msg.contains(&format!("pid {}", std::process::id())),
            "{msg}"
        );

        // A waiter gets it as soon as the holder goes.
        let waiter = tokio::spawn({
            let dir = tmp.path().to_owned();
            async move { StateLock::acquire(&dir, Duration::from_secs(10)).await }
        });
        tokio::time::sleep(Duration::from_millis(150)).await;
        drop(first);
        waiter.await.unwrap().unwrap();
    }
}
