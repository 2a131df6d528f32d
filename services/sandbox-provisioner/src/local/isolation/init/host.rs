//! The provisioner's side of a sandbox's init: start the sandbox's one bubblewrap with
//! the init in it, ask it to run commands, learn their exits. The init is the sandbox's
//! (it runs as the sandbox's uid, where a command can kill or replace it): a message it
//! sends can end only its own commands, and an init that goes away ends them all, which
//! their callers see as a command that died.

use super::{
    host_io::{is_pty_master, log_stderr},
    wire::{self, FromInit, Spec, ToInit},
};
use crate::local::isolation::bubblewrap::{bwrap::Invocation, kill_tree::KillTree, vfork::Process};
use rustix::fd::{AsFd, OwnedFd};
use std::{
    collections::HashMap,
    io,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
};
use tokio::{io::unix::AsyncFd, sync::oneshot};
use tokio_util::sync::CancellationToken;

/// How long a message to the init may wait for room: an init that reads nothing for
/// this long (stopped, or flooded) is ended.
const SEND_LIMIT: std::time::Duration = std::time::Duration::from_secs(5);
/// How long the init may take to open a command's terminal.
const MASTER_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// What the provisioner's end of the socket pair and the reader share.
struct Shared {
    sock: AsyncFd<OwnedFd>,
    /// Commands not yet exited, by tag: where their exit code goes.
    pending: Mutex<HashMap<u64, oneshot::Sender<i32>>>,
    /// Commands on a terminal the init opens, by tag: where its master goes.
    masters: Mutex<HashMap<u64, oneshot::Sender<OwnedFd>>>,
    /// Fired when the init is gone (its end closed, or it said something malformed).
    gone: CancellationToken,
    /// The sandbox's bubblewrap: killed, with everything in the sandbox, when the init
    /// is gone for whatever reason.
    bwrap: Mutex<(Process, KillTree)>,
}

impl Shared {
    fn pending(&self) -> std::sync::MutexGuard<'_, HashMap<u64, oneshot::Sender<i32>>> {
        self.pending
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn masters(&self) -> std::sync::MutexGuard<'_, HashMap<u64, oneshot::Sender<OwnedFd>>> {
        self.masters
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    async fn send(&self, msg: &ToInit, fds: &[rustix::fd::BorrowedFd<'_>]) -> io::Result<()> {
        let sent = tokio::time::timeout(SEND_LIMIT, async {
            loop {
                let mut guard = self.sock.writable().await?;
                if let Ok(result) = guard.try_io(|s| wire::send(s.get_ref().as_fd(), msg, fds)) {
                    return result;
                }
            }
        })
        .await
        .unwrap_or_else(|_| Err(io::Error::other("the sandbox's init reads nothing")));
        if sent.is_err() {
            self.end();
        }
        sent
    }

    /// The init is gone (or useless): kill the sandbox's bubblewrap, and with it every
    /// process of the sandbox; its commands learn it.
    fn end(&self) {
        self.gone.cancel();
        let mut bwrap = self
            .bwrap
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        bwrap.1.kill();
        bwrap.0.start_kill();
        drop(bwrap);
        self.pending().clear();
        self.masters().clear();
    }

    /// Whether the init is gone: its reader said so, or its bubblewrap has exited.
    fn is_gone(&self) -> bool {
        if self.gone.is_cancelled() {
            return true;
        }
        let exited = self
            .bwrap
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .0
            .try_wait();
        if exited {
            self.end();
        }
        exited
    }

    /// A kill from a place that cannot wait (a drop): the socket has room for a few
    /// thousand such messages, and a full one means the init is not reading anyway.
    fn send_now(&self, msg: &ToInit) {
        let _ = wire::send(self.sock.get_ref().as_fd(), msg, &[]);
    }
}

/// A sandbox's running init: dropping it kills the sandbox's bubblewrap, and with it
/// every process of the sandbox.
pub(crate) struct Init {
    shared: Arc<Shared>,
    next_tag: AtomicU64,
    reader: tokio::task::JoinHandle<()>,
    own_pty: bool,
}

impl Drop for Init {
    fn drop(&mut self) {
        self.shutdown();
    }
}

impl Init {
    /// Kill the sandbox's bubblewrap (and so every process in the sandbox) now, whoever
    /// still holds the init; its commands see it gone.
    pub(crate) fn shutdown(&self) {
        self.reader.abort();
        self.shared.end();
    }
}

/// Where a command's output goes.
pub(crate) enum Stdio3 {
    /// Pipes: the caller reads stdout and stderr; stdin is /dev/null.
    Piped,
    /// Pipes for stdout and stderr, as [`Self::Piped`]; stdin read from this descriptor
    /// (what the provisioner's own step feeds its command).
    Input(OwnedFd),
    /// A terminal (the pty's slave) as stdin, stdout, stderr and controlling terminal.
    Pty(OwnedFd),
    /// As [`Self::Pty`], on a terminal the sandbox's init opens in the sandbox's own
    /// devpts, `rows` × `cols`; its master comes back ([`InitChild::master`]).
    OwnPty { rows: u16, cols: u16 },
    /// As [`Self::OwnPty`], the master kept and relayed by the init (gVisor's, whose
    /// descriptors cannot leave it): [`InitChild::master`] is the provisioner's end of a
    /// stream socket carrying the terminal's output and input, [`InitChild::resizer`]
    /// what sets its size.
    RelayedPty { rows: u16, cols: u16 },
}

/// What resizes a terminal the sandbox's init relays ([`Stdio3::RelayedPty`]).
pub(crate) struct Resizer {
    shared: Arc<Shared>,
    tag: u64,
}

impl Resizer {
    pub(crate) fn resize(&self, rows: u16, cols: u16) {
        let tag = self.tag;
        self.shared.send_now(&ToInit::Resize { tag, rows, cols });
    }
}

/// A command started by an init.
pub(crate) struct InitChild {
    shared: Arc<Shared>,
    tag: u64,
    exit: Option<oneshot::Receiver<i32>>,
    master: Option<oneshot::Receiver<OwnedFd>>,
    pub(crate) stdout: Option<tokio::net::unix::pipe::Receiver>,
    pub(crate) stderr: Option<tokio::net::unix::pipe::Receiver>,
}

impl InitChild {
    /// Its exit code (128 + N for signal N); an error when the init went away first.
    pub(crate) async fn wait(&mut self) -> io::Result<i32> {
        let Some(exit) = self.exit.as_mut() else {
            return Err(io::Error::other("already waited for"));
        };
        let code = exit
            .await
            .map_err(|_| io::Error::other("the sandbox's init is gone"));
        self.exit = None;
        code
    }

    /// The master of the terminal the init opened for it ([`Stdio3::OwnPty`]).
    pub(crate) async fn master(&mut self) -> io::Result<OwnedFd> {
        let Some(rx) = self.master.take() else {
            return Err(io::Error::other("no terminal of the sandbox's own"));
        };
        match tokio::time::timeout(MASTER_WAIT, rx).await {
            Ok(Ok(master)) => Ok(master),
            Ok(Err(_)) => Err(io::Error::other(
                "the sandbox's init opened no terminal for the command",
            )),
            Err(_) => Err(io::Error::other(
                "the sandbox's init sent no terminal in time",
            )),
        }
    }

    /// What resizes its terminal, if the init relays it ([`Stdio3::RelayedPty`]).
    pub(crate) fn resizer(&self) -> Resizer {
        Resizer {
            shared: self.shared.clone(),
            tag: self.tag,
        }
    }

    /// SIGKILL its process group (what is left of the command is killed with it).
    pub(crate) fn kill(&self) {
        self.shared.send_now(&ToInit::Kill {
            tag: self.tag,
            signal: rustix::process::Signal::KILL.as_raw(),
        });
    }
}

impl Drop for InitChild {
    fn drop(&mut self) {
        if self.exit.is_some() {
            self.kill();
            self.shared.pending().remove(&self.tag);
            self.shared.masters().remove(&self.tag);
        }
    }
}

impl Init {
    /// Start the sandbox's bubblewrap (`inv`, the init last on its command line) with
    /// the control socket as the init's stdin.
    pub(crate) fn start(inv: &Invocation<'_>, sandbox_id: &str) -> io::Result<Self> {
        Self::start_with(sandbox_id, true, |stdin, stderr| {
            inv.spawn_init(stdin, stderr)
        })
    }

    /// Start the sandbox's runtime with `spawn`, given the init's stdin (the control
    /// socket) and stderr; `own_pty`: the init can open a terminal of the sandbox's own
    /// and send its master out (not from gVisor's kernel, whose descriptors stay in it).
    pub(crate) fn start_with(
        sandbox_id: &str,
        own_pty: bool,
        spawn: impl FnOnce(OwnedFd, OwnedFd) -> io::Result<Process>,
    ) -> io::Result<Self> {
        let (ours, theirs) = wire::pair()?;
        let (err_r, err_w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?;
        // Our copies of the init's ends close here: its exit must close the socket.
        let child = spawn(theirs, err_w)?;
        let tree = KillTree(Some(child.id()));
        let stderr = tokio::net::unix::pipe::Receiver::from_owned_fd(err_r)?;
        tokio::spawn(log_stderr(stderr, sandbox_id.to_owned()));
        let shared = Arc::new(Shared {
            // Deprecated for a descriptor it does not own; this one it owns (moved in).
            #[allow(deprecated)]
            sock: AsyncFd::new(ours)?,
            pending: Mutex::default(),
            masters: Mutex::default(),
            gone: CancellationToken::new(),
            bwrap: Mutex::new((child, tree)),
        });
        let reader = tokio::spawn(read(shared.clone(), sandbox_id.to_owned()));
        Ok(Self {
            shared,
            next_tag: AtomicU64::new(1),
            reader,
            own_pty,
        })
    }

    /// Whether the init can open a terminal of the sandbox's own ([`Stdio3::OwnPty`]).
    pub(crate) fn own_pty(&self) -> bool {
        self.own_pty
    }

    /// Whether the init is gone (a new command then needs a new one).
    pub(crate) fn is_gone(&self) -> bool {
        self.shared.is_gone()
    }

    /// Run `spec` in the sandbox.
    pub(crate) async fn spawn(&self, spec: &Spec, stdio: Stdio3) -> io::Result<InitChild> {
        let tag = self.next_tag.fetch_add(1, Ordering::Relaxed);
        let memfd = wire::spec_memfd(spec)?;
        let (tx, rx) = oneshot::channel();
        let mut child = InitChild {
            shared: self.shared.clone(),
            tag,
            exit: Some(rx),
            master: None,
            stdout: None,
            stderr: None,
        };
        self.shared.pending().insert(tag, tx);
        let mut own_size = None;
        let relay = matches!(stdio, Stdio3::RelayedPty { .. });
        let (pty, input, theirs) = match stdio {
            Stdio3::Piped | Stdio3::Input(_) => {
                let (out_r, out_w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?;
                let (err_r, err_w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?;
                child.stdout = Some(tokio::net::unix::pipe::Receiver::from_owned_fd(out_r)?);
                child.stderr = Some(tokio::net::unix::pipe::Receiver::from_owned_fd(err_r)?);
                match stdio {
                    Stdio3::Input(stdin) => (false, true, vec![memfd, stdin, out_w, err_w]),
                    _ => (false, false, vec![memfd, out_w, err_w]),
                }
            }
            Stdio3::Pty(slave) => (true, false, vec![memfd, slave]),
            Stdio3::OwnPty { rows, cols } => {
                let (tx, rx) = oneshot::channel();
                self.shared.masters().insert(tag, tx);
                child.master = Some(rx);
                own_size = Some((rows, cols));
                (true, false, vec![memfd])
            }
            Stdio3::RelayedPty { rows, cols } => {
                let (ours, theirs) = rustix::net::socketpair(
                    rustix::net::AddressFamily::UNIX,
                    rustix::net::SocketType::STREAM,
                    rustix::net::SocketFlags::CLOEXEC,
                    None,
                )?;
                let (tx, rx) = oneshot::channel();
                let _ = tx.send(ours);
                child.master = Some(rx);
                own_size = Some((rows, cols));
                (true, false, vec![memfd, theirs])
            }
        };
        let fds: Vec<_> = theirs.iter().map(AsFd::as_fd).collect();
        if self.shared.is_gone() {
            return Err(io::Error::other("the sandbox's init is gone"));
        }
        let (rows, cols) = own_size.unwrap_or_default();
        let msg = ToInit::Spawn {
            tag,
            pty,
            stdin: input,
            own_pty: own_size.is_some(),
            rows,
            cols,
            relay,
        };
        self.shared.send(&msg, &fds).await?;
        // Our copies of the write ends close here: the pipes end when the command's do.
        drop(theirs);
        Ok(child)
    }
}

/// Read the init's reports until it is gone; then every command still pending learns
/// it (its exit sender is dropped).
async fn read(shared: Arc<Shared>, sandbox_id: String) {
    loop {
        let Ok(mut guard) = shared.sock.readable().await else {
            break;
        };
        let got = match guard.try_io(|s| wire::recv::<FromInit>(s.get_ref().as_fd())) {
            Ok(got) => got,
            Err(_would_block) => continue,
        };
        match got {
            Ok(Some((msg, fds))) => match msg {
                FromInit::Started { .. } => {}
                FromInit::Pty { tag } => {
                    let tx = shared.masters().remove(&tag);
                    // What the init sends is the sandbox's: used only if it is a pty master.
                    if let (Some(tx), Some(master)) = (tx, fds.into_iter().next())
                        && is_pty_master(&master)
                    {
                        let _ = tx.send(master);
                    }
                }
                FromInit::Failed { tag, code } | FromInit::Exited { tag, code } => {
                    shared.masters().remove(&tag);
                    if let Some(tx) = shared.pending().remove(&tag) {
                        let _ = tx.send(code);
                    }
                }
            },
            Ok(None) => break,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                tracing::warn!(%sandbox_id, error = %e, "sandbox init: unreadable report");
                break;
            }
        }
    }
    shared.end();
}
