//! A command about to start and, once started, running: a process of the host (a
//! bubblewrap of its own, or a host tool) or a command of a sandbox's init. Exec, the
//! streamed exec and the PTY read, wait for and kill either the same way.

use crate::local::isolation::{
    bubblewrap::kill_tree::KillTree,
    init::{
        host::{Init, InitChild, Resizer, Stdio3},
        wire::Spec,
    },
};
use std::{process::Stdio, sync::Arc, time::Duration};
use tokio::io::AsyncRead;

/// How long a killed command's exit is waited for before it is given up on.
const REAP_AFTER_KILL: Duration = Duration::from_secs(2);

pub(crate) enum Launch {
    /// A process of the host, `kill_on_drop`; for a bubblewrap, its whole sandbox dies
    /// with it.
    Process(tokio::process::Command),
    /// A command for the sandbox's init; the init is kept alive while it runs.
    Init { init: Arc<Init>, spec: Spec },
}

/// A started command's output stream.
pub(crate) type Output = Box<dyn AsyncRead + Send + Unpin>;

pub(crate) struct Running {
    /// `None` on a pty (the output is read from the master).
    pub(crate) stdout: Option<Output>,
    pub(crate) stderr: Option<Output>,
    /// The master of a terminal the sandbox's init opened ([`Stdio3::OwnPty`]), or the
    /// socket it relays one to ([`Stdio3::RelayedPty`]).
    pub(crate) pty_master: Option<std::os::fd::OwnedFd>,
    /// What resizes a relayed terminal ([`Stdio3::RelayedPty`]).
    pub(crate) resizer: Option<Resizer>,
    proc: Proc,
}

enum Proc {
    Process {
        child: tokio::process::Child,
        tree: KillTree,
    },
    Init {
        child: InitChild,
        _init: Arc<Init>,
    },
}

impl Launch {
    /// Whether it runs under a sandbox's init that can open a terminal of the sandbox's
    /// own ([`Stdio3::OwnPty`]; gVisor's cannot hand one out).
    pub(crate) fn opens_own_pty(&self) -> bool {
        matches!(self, Self::Init { init, .. } if init.own_pty())
    }

    /// Whether it runs under a sandbox's init that relays a terminal of the sandbox's
    /// own instead ([`Stdio3::RelayedPty`]: gVisor's).
    pub(crate) fn relays_pty(&self) -> bool {
        matches!(self, Self::Init { init, .. } if !init.own_pty())
    }

    pub(crate) async fn spawn(self, stdio: Stdio3) -> std::io::Result<Running> {
        match self {
            Self::Process(cmd) => spawn_process(cmd, stdio),
            Self::Init { init, spec } => {
                let own_pty = matches!(stdio, Stdio3::OwnPty { .. } | Stdio3::RelayedPty { .. });
                let relayed = matches!(stdio, Stdio3::RelayedPty { .. });
                let mut child = init.spawn(&spec, stdio).await?;
                let stdout = child.stdout.take().map(|s| Box::new(s) as Output);
                let stderr = child.stderr.take().map(|s| Box::new(s) as Output);
                // Dropped on an error, the child is killed.
                let pty_master = if own_pty {
                    Some(child.master().await?)
                } else {
                    None
                };
                Ok(Running {
                    stdout,
                    stderr,
                    pty_master,
                    resizer: relayed.then(|| child.resizer()),
                    proc: Proc::Init { child, _init: init },
                })
            }
        }
    }
}

/// A process of the host started with `stdio`, killed with its tree when dropped.
fn spawn_process(mut cmd: tokio::process::Command, stdio: Stdio3) -> std::io::Result<Running> {
    match stdio {
        Stdio3::OwnPty { .. } | Stdio3::RelayedPty { .. } => {
            return Err(std::io::Error::other(
                "a terminal of the sandbox's own needs the sandbox's init",
            ));
        }
        Stdio3::Piped => {
            cmd.stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
        }
        Stdio3::Input(input) => {
            cmd.stdin(Stdio::from(input))
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
        }
        Stdio3::Pty(slave) => {
            cmd.stdin(Stdio::from(slave.try_clone()?))
                .stdout(Stdio::from(slave.try_clone()?))
                .stderr(Stdio::from(slave));
        }
    }
    cmd.kill_on_drop(true);
    let spawned = cmd.spawn();
    // Every parent copy of a pty's slave is dropped here, so reads of the
    // master see EIO once the command is gone.
    drop(cmd);
    let mut child = spawned?;
    let tree = KillTree(child.id());
    let stdout = child.stdout.take().map(|s| Box::new(s) as Output);
    let stderr = child.stderr.take().map(|s| Box::new(s) as Output);
    Ok(Running {
        stdout,
        stderr,
        pty_master: None,
        resizer: None,
        proc: Proc::Process { child, tree },
    })
}

impl Running {
    /// Its exit code (128 + N for signal N); -1 when it cannot be known (its sandbox's
    /// init went away). Cancel-safe.
    pub(crate) async fn wait(&mut self) -> i32 {
        match &mut self.proc {
            Proc::Process { child, tree } => match child.wait().await {
                Ok(status) => {
                    tree.disarm();
                    status.code().unwrap_or(-1)
                }
                Err(_) => -1,
            },
            Proc::Init { child, .. } => child.wait().await.unwrap_or(-1),
        }
    }

    /// Kill it, and everything of it, and reap it.
    pub(crate) async fn kill(&mut self) {
        match &mut self.proc {
            Proc::Process { child, tree } => {
                tree.kill();
                let _ = child.start_kill();
                let _ = child.wait().await;
            }
            Proc::Init { child, .. } => {
                child.kill();
                let _ = tokio::time::timeout(REAP_AFTER_KILL, child.wait()).await;
            }
        }
    }
}
