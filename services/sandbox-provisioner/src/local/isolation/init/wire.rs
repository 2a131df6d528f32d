//! The control protocol between the provisioner and a sandbox's init: JSON messages on a
//! `SOCK_SEQPACKET` socket pair (one message per `sendmsg`, never split or merged), the
//! command's descriptors passed alongside (`SCM_RIGHTS`). A command's argv and
//! environment travel in a memfd, not in the message: they may be a megabyte, more than
//! a socket buffer holds, and a memfd is never on a command line or on disk.
//!
//! The provisioner trusts nothing the init says beyond the exit code of its own command:
//! the init runs inside the sandbox, as the sandbox's uid, where a command can replace it.

use rustix::{
    fd::{BorrowedFd, OwnedFd},
    net::{
        RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
        SendAncillaryMessage, SendFlags,
    },
};
use serde::{Deserialize, Serialize, de::DeserializeOwned};
use std::{
    io::{self, IoSlice, IoSliceMut},
    mem::MaybeUninit,
};

/// The most descriptors a message carries: the spec, stdin, stdout, stderr.
pub const MAX_FDS: usize = 4;
/// The longest message either side sends (they are a few dozen bytes).
pub const MAX_MESSAGE: usize = 4096;

/// From the provisioner to the init.
#[derive(Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum ToInit {
    /// Run a command. Descriptors: the [`Spec`] memfd, with `stdin` the command's stdin
    /// (else /dev/null), then stdout and stderr; with `pty`, the spec and the terminal
    /// (stdin, stdout and stderr, and the controlling terminal of a session of the
    /// command's own).
    Spawn {
        tag: u64,
        pty: bool,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        stdin: bool,
        /// With `pty`: no terminal is passed. The init opens one in the sandbox's own
        /// devpts (so the command's `ttyname` finds it there), sized `rows` × `cols`,
        /// and sends its master back ([`FromInit::Pty`]) before it starts the command.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        own_pty: bool,
        #[serde(default)]
        rows: u16,
        #[serde(default)]
        cols: u16,
        /// With `own_pty`: the master is not sent back (gVisor's kernel cannot hand its
        /// terminal out); the init relays it to the descriptor passed after the spec (a
        /// stream socket, the provisioner's side of the terminal) and keeps it for
        /// [`ToInit::Resize`].
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        relay: bool,
    },
    /// Send `signal` to the command's process group.
    Kill { tag: u64, signal: i32 },
    /// The new size of the terminal the init relays for command `tag`: its foreground
    /// process group gets SIGWINCH, as on any terminal.
    Resize { tag: u64, rows: u16, cols: u16 },
}

/// What to run: the whole argv and environment (nothing is inherited from the init).
#[derive(Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Spec {
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
}

/// From the init to the provisioner.
#[derive(Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "ev", rename_all = "snake_case")]
pub enum FromInit {
    /// The master of the terminal the init opened for command `tag` (the descriptor
    /// passed with it), sent before the command starts.
    Pty { tag: u64 },
    /// The command runs, as `pid` of the sandbox's pid namespace.
    Started { tag: u64, pid: i32 },
    /// It could not be started (the init wrote why on its stderr): 127 not found, 126
    /// not executable, 125 anything else.
    Failed { tag: u64, code: i32 },
    /// It ended: its exit code, or 128 + the signal that ended it. Its process group was
    /// killed then.
    Exited { tag: u64, code: i32 },
}

/// Send one message with `fds`.
pub fn send(sock: BorrowedFd<'_>, msg: &impl Serialize, fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    let bytes = serde_json::to_vec(msg).map_err(io::Error::other)?;
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() && !control.push(SendAncillaryMessage::ScmRights(fds)) {
        return Err(io::Error::other("too many descriptors for one message"));
    }
    rustix::net::sendmsg(
        sock,
        &[IoSlice::new(&bytes)],
        &mut control,
        SendFlags::NOSIGNAL,
    )?;
    Ok(())
}

/// Receive one message and the descriptors that came with it; `None` when the other end
/// is closed. A message that is not one of `T` is an error (its descriptors are closed).
pub fn recv<T: DeserializeOwned>(sock: BorrowedFd<'_>) -> io::Result<Option<(T, Vec<OwnedFd>)>> {
    let mut buf = [0u8; MAX_MESSAGE];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let got = rustix::net::recvmsg(
        sock,
        &mut [IoSliceMut::new(&mut buf)],
        &mut control,
        RecvFlags::CMSG_CLOEXEC,
    )?;
    let mut fds = Vec::new();
    for msg in control.drain() {
        if let RecvAncillaryMessage::ScmRights(received) = msg {
            fds.extend(received);
        }
    }
    if got.bytes == 0 && fds.is_empty() {
        return Ok(None);
    }
    let msg = serde_json::from_slice(&buf[..got.bytes.min(buf.len())])
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
    Ok(Some((msg, fds)))
}

/// A connected pair: (the provisioner's end, close-on-exec and non-blocking; the init's).
pub fn pair() -> io::Result<(OwnedFd, OwnedFd)> {
    use rustix::net::{AddressFamily, SocketFlags, SocketType};
    let (ours, theirs) = rustix::net::socketpair(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC,
        None,
    )?;
    rustix::io::ioctl_fionbio(&ours, true)?;
    Ok((ours, theirs))
}

/// An anonymous in-memory file holding `spec`, positioned at its start.
pub fn spec_memfd(spec: &Spec) -> io::Result<OwnedFd> {
    use std::io::{Seek, Write};
    let fd = rustix::fs::memfd_create("forkyard-spec", rustix::fs::MemfdFlags::CLOEXEC)?;
    let mut file = std::fs::File::from(fd);
    serde_json::to_writer(&mut file, spec).map_err(io::Error::other)?;
    file.flush()?;
    file.rewind()?;
    Ok(file.into())
}

/// Read a [`Spec`] back, refusing one larger than `limit` bytes.
pub fn read_spec(fd: OwnedFd, limit: u64) -> io::Result<Spec> {
    use std::io::Read;
    let mut data = Vec::new();
    std::fs::File::from(fd)
        .take(limit + 1)
        .read_to_end(&mut data)?;
    if data.len() as u64 > limit {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "spec too large"));
    }
    serde_json::from_slice(&data).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// What a `ToInit::Spawn` asks for, as the init reads it (`guest`, `terminal`).
#[derive(Clone, Copy)]
pub(super) struct Asked {
    pub(super) tag: u64,
    pub(super) pty: bool,
    /// The descriptor after the spec is the command's stdin.
    pub(super) stdin: bool,
    /// A terminal of the sandbox's own devpts, opened here (rows, cols).
    pub(super) own_pty: bool,
    /// With `own_pty`: relayed to the descriptor passed after the spec, not sent back.
    pub(super) relay: bool,
    pub(super) size: (u16, u16),
}
