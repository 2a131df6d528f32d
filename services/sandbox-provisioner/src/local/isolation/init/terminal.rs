//! A pty command's terminal opened by the sandbox's init in the sandbox's own devpts, so
//! that it is a terminal to the command (`isatty`, `stty`, job control) and its line
//! discipline the sandbox kernel's: ^C becomes SIGINT and a resize SIGWINCH for the
//! command's foreground process group there. Under bubblewrap its master is sent to the
//! provisioner ([`sent_back`]). gVisor's kernel cannot hand a descriptor of its own out,
//! and a terminal passed in from the host is a plain file to it (no `TCGETS`, no
//! controlling terminal, no signals), so there the init keeps the master and copies it
//! to and from a stream socket the provisioner passed ([`Terminals::relayed`]); a resize
//! comes as a message ([`Terminals::resize`]). gVisor's line discipline (runsc 20221219)
//! sends no signal of its own, for ^C or a resize, so the relay does what Linux's does:
//! with `ISIG` on, the interrupt, quit and suspend characters of the input become
//! SIGINT, SIGQUIT and SIGTSTP for the foreground process group instead of input, and a
//! resize that changes the size sends it SIGWINCH.

use super::wire::{self, Asked, FromInit};
use rustix::{
    fd::{AsFd, BorrowedFd, OwnedFd},
    process::{Pid, Signal},
    termios::Winsize,
};
use std::{
    borrow::Cow,
    collections::HashMap,
    io,
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicI32, Ordering},
    },
};

/// `fds` with a terminal of the sandbox's own devpts in place of a passed one: its
/// master sent to the provisioner, its slave received as a terminal passed in (after
/// the spec); `None`: no terminal could be opened (said on the init's stderr).
pub(super) fn sent_back(sock: &OwnedFd, asked: Asked, fds: Vec<OwnedFd>) -> Option<Vec<OwnedFd>> {
    let mut fds = fds;
    match open_pty(asked.size) {
        Ok((master, slave)) => {
            let pty = FromInit::Pty { tag: asked.tag };
            let _ = wire::send(sock.as_fd(), &pty, &[master.as_fd()]);
            fds.truncate(1);
            fds.push(slave);
            Some(fds)
        }
        Err(e) => {
            eprintln!("sandbox init: cannot open a terminal: {e}");
            None
        }
    }
}

/// A terminal this init relays: its master, and the command's pid once started (the
/// group signalled where the terminal names no foreground group).
struct Relayed {
    master: Arc<OwnedFd>,
    leader: Arc<AtomicI32>,
}

/// The terminals this init relays, by command tag.
#[derive(Default)]
pub(super) struct Terminals(Mutex<HashMap<u64, Relayed>>);

impl Terminals {
    /// `fds` (the spec, then the provisioner's socket) with a terminal of the sandbox's
    /// own in place of the socket: its master relayed to the socket until either side
    /// ends; `None`: no socket was passed, or no terminal could be opened.
    pub(super) fn relayed(&self, asked: Asked, fds: Vec<OwnedFd>) -> Option<Vec<OwnedFd>> {
        let mut fds = fds.into_iter();
        let spec = fds.next()?;
        let peer = fds.next()?;
        let leader = Arc::new(AtomicI32::new(0));
        let opened = open_pty(asked.size).and_then(|(master, slave)| {
            let master = Arc::new(master);
            relay(&master, peer, &leader)?;
            Ok((master, slave))
        });
        match opened {
            Ok((master, slave)) => {
                self.lock().insert(asked.tag, Relayed { master, leader });
                Some(vec![spec, slave])
            }
            Err(e) => {
                eprintln!("sandbox init: cannot open a terminal: {e}");
                None
            }
        }
    }

    /// Command `tag` runs as `pid`, the leader of its session and process group.
    pub(super) fn started(&self, tag: u64, pid: i32) {
        if let Some(t) = self.lock().get(&tag) {
            t.leader.store(pid, Ordering::Release);
        }
    }

    /// The terminal of command `tag` is now `rows` × `cols`.
    pub(super) fn resize(&self, tag: u64, size: (u16, u16)) {
        let Some((master, leader)) = self
            .lock()
            .get(&tag)
            .map(|t| (t.master.clone(), t.leader.clone()))
        else {
            return;
        };
        let before = rustix::termios::tcgetwinsize(&*master).ok();
        let size = winsize(size);
        let changed = before.is_none_or(|b| (b.ws_row, b.ws_col) != (size.ws_row, size.ws_col));
        if rustix::termios::tcsetwinsize(&*master, size).is_ok() && changed {
            signal_foreground(&master, &leader, Signal::WINCH);
        }
    }

    /// Command `tag` has ended: its master is closed here (the relay's copies end when
    /// the last process holding its terminal does).
    pub(super) fn remove(&self, tag: u64) {
        self.lock().remove(&tag);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Relayed>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Copy `master`'s output to `peer` and `peer`'s input to `master`, each on a thread of
/// its own. Output ends when the last process holding the terminal has closed it (EIO),
/// and then the socket is shut, which ends the input's copy too.
fn relay(master: &Arc<OwnedFd>, peer: OwnedFd, leader: &Arc<AtomicI32>) -> io::Result<()> {
    let out_from = master.try_clone()?;
    let in_from = peer.try_clone()?;
    let (master, leader) = (master.clone(), leader.clone());
    std::thread::Builder::new()
        .name("pty-out".into())
        .spawn(move || {
            copy(out_from.as_fd(), peer.as_fd(), |b: &[u8]| Cow::Borrowed(b));
            let _ = rustix::net::shutdown(&peer, rustix::net::Shutdown::Both);
        })?;
    std::thread::Builder::new()
        .name("pty-in".into())
        .spawn(move || {
            copy(in_from.as_fd(), master.as_fd(), |input| {
                Cow::Owned(without_signals(input, &master, &leader))
            });
        })?;
    Ok(())
}

/// Everything read from `from`, passed through `edit`, written to `to`, until either
/// fails or `from` ends.
fn copy(
    from: BorrowedFd<'_>,
    to: BorrowedFd<'_>,
    edit: impl for<'a> Fn(&'a [u8]) -> Cow<'a, [u8]>,
) {
    let mut buf = [0u8; 16 * 1024];
    loop {
        let n = match rustix::io::read(from, &mut buf) {
            Ok(0) => return,
            Ok(n) => n,
            Err(rustix::io::Errno::INTR) => continue,
            Err(_) => return,
        };
        let edited = edit(&buf[..n]);
        let mut left = &edited[..];
        while !left.is_empty() {
            match rustix::io::write(to, left) {
                Ok(w) => left = &left[w..],
                Err(rustix::io::Errno::INTR) => {}
                Err(_) => return,
            }
        }
    }
}

/// `input` without the characters the terminal's settings make signals (`ISIG`: the
/// interrupt, quit and suspend characters), each of which is sent to its foreground
/// process group instead, in order, as Linux's line discipline does.
fn without_signals(input: &[u8], master: &OwnedFd, leader: &AtomicI32) -> Vec<u8> {
    use rustix::termios::{LocalModes, SpecialCodeIndex as C};
    let Ok(t) = rustix::termios::tcgetattr(master) else {
        return input.to_vec();
    };
    if !t.local_modes.contains(LocalModes::ISIG) {
        return input.to_vec();
    }
    let signals = [
        (t.special_codes[C::VINTR], Signal::INT),
        (t.special_codes[C::VQUIT], Signal::QUIT),
        (t.special_codes[C::VSUSP], Signal::TSTP),
    ];
    let mut kept = Vec::with_capacity(input.len());
    for &b in input {
        // 0 is `_POSIX_VDISABLE`: a character turned off.
        match signals.iter().find(|(c, _)| *c != 0 && *c == b) {
            Some((_, sig)) => signal_foreground(master, leader, *sig),
            None => kept.push(b),
        }
    }
    kept
}

/// `sig` to the terminal's foreground process group, or, where it names none, to the
/// command's (its leader's pid is its group's id).
fn signal_foreground(master: &OwnedFd, leader: &AtomicI32, sig: Signal) {
    let group = rustix::termios::tcgetpgrp(master)
        .ok()
        .or_else(|| Pid::from_raw(leader.load(Ordering::Acquire)));
    if let Some(group) = group {
        let _ = rustix::process::kill_process_group(group, sig);
    }
}

fn winsize((rows, cols): (u16, u16)) -> Winsize {
    Winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    }
}

/// A pty pair of the sandbox's own devpts (its `/dev/ptmx`), the window `rows` × `cols`:
/// (master, slave). The slave is opened from the master (`TIOCGPTPEER`), not by name,
/// where the kernel has it (gVisor's of runsc 20221219 does not: there by its name).
fn open_pty(size: (u16, u16)) -> io::Result<(OwnedFd, OwnedFd)> {
    use rustix::pty::OpenptFlags;
    let flags = OpenptFlags::RDWR | OpenptFlags::NOCTTY | OpenptFlags::CLOEXEC;
    let master = rustix::pty::openpt(flags)?;
    rustix::pty::grantpt(&master)?;
    rustix::pty::unlockpt(&master)?;
    rustix::termios::tcsetwinsize(&master, winsize(size))?;
    let slave = match rustix::pty::ioctl_tiocgptpeer(&master, flags) {
        Err(rustix::io::Errno::NOTTY | rustix::io::Errno::INVAL) => {
            let name = rustix::pty::ptsname(&master, Vec::new())?;
            let how = rustix::fs::OFlags::RDWR
                | rustix::fs::OFlags::NOCTTY
                | rustix::fs::OFlags::NOFOLLOW
                | rustix::fs::OFlags::CLOEXEC;
            rustix::fs::open(name.as_c_str(), how, rustix::fs::Mode::empty())?
        }
        other => other?,
    };
    Ok((master, slave))
}
