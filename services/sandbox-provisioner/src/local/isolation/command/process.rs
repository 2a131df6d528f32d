//! Running a child process to completion: output captured up to a cap, a wall-clock
//! limit, and an external cancel (destroy). The child is spawned with `kill_on_drop`, so
//! dropping the future (a caller that hung up) kills it.

use crate::local::{
    base::read_buf::ReadBuf,
    isolation::{command::launch::Launch, init::host::Stdio3},
};
use std::{os::fd::OwnedFd, time::Duration};
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio_util::sync::CancellationToken;

/// How long to keep reading a killed child's pipes before giving up on them.
const DRAIN_AFTER_KILL: Duration = Duration::from_secs(2);

/// One captured stream: the first `cap` bytes and the full length seen.
#[derive(Debug, Default)]
pub struct Captured {
    pub bytes: Vec<u8>,
    pub total: u64,
}

impl Captured {
    pub fn truncated(&self) -> bool {
        self.total > self.bytes.len() as u64
    }

    pub fn lossy(&self) -> String {
        String::from_utf8_lossy(&self.bytes).into_owned()
    }
}

#[derive(Debug)]
pub enum Outcome {
    /// The process exited; `code` is -1 when a signal ended it.
    Exited {
        code: i32,
    },
    TimedOut,
    /// `cancel` fired (the sandbox is being destroyed) and the process was killed.
    Cancelled,
}

#[derive(Debug)]
pub struct Finished {
    pub outcome: Outcome,
    pub stdout: Captured,
    pub stderr: Captured,
    pub duration: Duration,
}

/// Caps for the two captured streams.
#[derive(Debug, Clone, Copy)]
pub struct Caps {
    pub stdout: usize,
    pub stderr: usize,
    /// Keep the last bytes of each stream rather than the first.
    pub tail: bool,
}

/// Spawn the command (stdin from `input`, else /dev/null) and wait for it, its timeout
/// or `cancel`.
pub(crate) async fn run(
    launch: Launch,
    input: Option<OwnedFd>,
    timeout: Duration,
    caps: Caps,
    cancel: &CancellationToken,
) -> std::io::Result<Finished> {
    let started = std::time::Instant::now();
    let stdio = input.map_or(Stdio3::Piped, Stdio3::Input);
    let mut running = launch.spawn(stdio).await?;
    let stdout = running.stdout.take().expect("stdout is piped");
    let stderr = running.stderr.take().expect("stderr is piped");
    let io = async {
        tokio::join!(
            read_capped(stdout, caps.stdout, caps.tail),
            read_capped(stderr, caps.stderr, caps.tail)
        )
    };
    tokio::pin!(io);
    let deadline = tokio::time::sleep(timeout);
    tokio::pin!(deadline);

    let mut output = None;
    let outcome = loop {
        tokio::select! {
            out = &mut io, if output.is_none() => output = Some(out),
            // A command ended by a stop or destroy (its init killed) is a cancelled one.
            code = running.wait() => break if cancel.is_cancelled() {
                Outcome::Cancelled
            } else {
                Outcome::Exited { code }
            },
            () = &mut deadline => {
                running.kill().await;
                break Outcome::TimedOut;
            }
            () = cancel.cancelled() => {
                running.kill().await;
                break Outcome::Cancelled;
            }
        }
    };
    // Once the command is gone its output ends, unless something it left outside its
    // process group holds the pipes: that is not waited for long.
    let (stdout, stderr) = match output {
        Some(out) => out,
        None => tokio::time::timeout(DRAIN_AFTER_KILL, io)
            .await
            .unwrap_or_default(),
    };
    Ok(Finished {
        outcome,
        stdout,
        stderr,
        duration: started.elapsed(),
    })
}

/// Read `reader` to its end, keeping the first `cap` bytes (or with `tail` the last) and
/// counting the rest (the pipe is drained so the writer never blocks on a full pipe).
async fn read_capped(mut reader: impl AsyncRead + Unpin, cap: usize, tail: bool) -> Captured {
    let mut out = Captured::default();
    let mut buf = ReadBuf::new(64 * 1024);
    loop {
        match reader.read(buf.space()).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                let read = buf.took(n);
                out.total += n as u64;
                if tail {
                    out.bytes.extend_from_slice(read);
                    // Cut now and then, not at every read: each cut moves `cap` bytes.
                    if out.bytes.len() >= cap.saturating_mul(2).max(64 * 1024) {
                        out.bytes.drain(..out.bytes.len() - cap);
                    }
                } else {
                    let room = cap.saturating_sub(out.bytes.len());
                    out.bytes.extend_from_slice(&read[..n.min(room)]);
                }
            }
        }
    }
    if out.bytes.len() > cap {
        out.bytes.drain(..out.bytes.len() - cap);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(script: &str) -> Launch {
        let mut c = tokio::process::Command::new("sh");
        c.arg("-c").arg(script);
        Launch::Process(c)
    }

    #[tokio::test]
    async fn captures_with_cap_and_exit_code() {
        let caps = Caps {
            stdout: 4,
            stderr: 100,
            tail: false,
        };
        let f = run(
            sh("printf 0123456789; echo err >&2; exit 3"),
            None,
            Duration::from_secs(10),
            caps,
            &CancellationToken::new(),
        )
        .await
        .unwrap();
        assert!(matches!(f.outcome, Outcome::Exited { code: 3 }));
        assert_eq!(f.stdout.bytes, b"0123");
        assert_eq!(f.stdout.total, 10);
        assert!(f.stdout.truncated());
        assert_eq!(f.stderr.lossy(), "err\n");
    }

    #[tokio::test]
    async fn a_tail_cap_keeps_the_last_bytes_of_a_long_output() {
        let caps = Caps {
            stdout: 10,
            stderr: 10,
            tail: true,
        };
        // 600 KB, read in many chunks: the kept bytes are cut more than once.
        let f = run(
            sh("seq 1 100000; echo last-words >&2"),
            None,
            Duration::from_secs(10),
            caps,
            &CancellationToken::new(),
        )
        .await
        .unwrap();
        assert_eq!(f.stdout.lossy(), "99\n100000\n");
        assert!(f.stdout.truncated());
        assert_eq!(f.stderr.lossy(), "ast-words\n");
        assert_eq!(f.stderr.total, 11);
    }

    #[tokio::test]
    async fn timeout_kills() {
        let caps = Caps {
            stdout: 10,
            stderr: 10,
            tail: false,
        };
        let f = run(
            sh("exec sleep 60"),
            None,
            Duration::from_millis(200),
            caps,
            &CancellationToken::new(),
        )
        .await
        .unwrap();
        assert!(matches!(f.outcome, Outcome::TimedOut));
        // Killed at its timeout, not waited for to the end of its sleep.
        assert!(f.duration < Duration::from_secs(30), "{:?}", f.duration);
    }
}
