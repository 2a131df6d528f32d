//! The terminal of a pty command: the pty pair (rustix: openpt/grantpt/unlockpt/ptsname —
//! no unsafe), its window size, the open ptys by id, and the `setsid --ctty` wrapper
//! that makes the pty a command's controlling terminal where there is no init to do it.

use crate::local::isolation::init::host::Resizer;
use rustix::{
    fd::OwnedFd,
    fs::{Mode, OFlags},
    pty::OpenptFlags,
    termios::Winsize,
};
use std::{
    collections::HashMap,
    io::Write,
    sync::{Arc, Mutex},
};

/// util-linux `setsid`, visible inside the sandbox through the read-only /usr.
const SETSID: &str = "/usr/bin/setsid";

/// `argv` as run inside the sandbox: under `setsid --wait --ctty` when the host has it.
pub(crate) fn with_ctty(argv: &[String]) -> Vec<String> {
    static HAVE_SETSID: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let have = *HAVE_SETSID.get_or_init(|| {
        let found = std::path::Path::new(SETSID).is_file();
        if !found {
            tracing::warn!(
                path = SETSID,
                "no setsid: pty commands get no controlling terminal (no ^C, no SIGWINCH)"
            );
        }
        found
    });
    if !have {
        return argv.to_vec();
    }
    [SETSID, "--wait", "--ctty", "--"]
        .iter()
        .map(|s| (*s).to_owned())
        .chain(argv.iter().cloned())
        .collect()
}

/// A running pty command: its master side, shared by the writer and the resizer.
pub(crate) struct Pty {
    sandbox_id: String,
    master: Mutex<std::fs::File>,
    /// Where the master is the sandbox's init's (gVisor's): what sets its size.
    resizer: Option<Resizer>,
}

impl Pty {
    /// Input for the command, as typed on its terminal.
    pub(crate) fn write(&self, data: &[u8]) -> std::io::Result<()> {
        self.master.lock().expect("pty lock").write_all(data)
    }

    /// The terminal's new size (the command's foreground group gets SIGWINCH).
    pub(crate) fn resize(&self, rows: u32, cols: u32) -> rustix::io::Result<()> {
        let size = winsize(rows, cols);
        if let Some(r) = &self.resizer {
            r.resize(size.ws_row, size.ws_col);
            return Ok(());
        }
        let m = self.master.lock().expect("pty lock");
        rustix::termios::tcsetwinsize(&*m, size)
    }
}

/// Open pty sessions by id.
#[derive(Default)]
pub(crate) struct Ptys(Mutex<HashMap<String, Arc<Pty>>>);

impl Ptys {
    /// Keep `master` as a new pty of `sandbox_id` (resized by `resizer` where the
    /// sandbox's init holds the real one); returns its id.
    pub(crate) fn add(
        &self,
        sandbox_id: &str,
        master: std::fs::File,
        resizer: Option<Resizer>,
    ) -> String {
        let pty_id = format!("pty-{}", uuid::Uuid::new_v4().simple());
        let pty = Arc::new(Pty {
            sandbox_id: sandbox_id.to_owned(),
            master: Mutex::new(master),
            resizer,
        });
        self.0
            .lock()
            .expect("ptys lock")
            .insert(pty_id.clone(), pty);
        pty_id
    }

    /// The pty `pty_id`, if it is open and `sandbox_id`'s.
    pub(crate) fn get(&self, sandbox_id: &str, pty_id: &str) -> Option<Arc<Pty>> {
        self.0
            .lock()
            .expect("ptys lock")
            .get(pty_id)
            .filter(|p| p.sandbox_id == sandbox_id)
            .cloned()
    }

    pub(crate) fn remove(&self, pty_id: &str) {
        self.0.lock().expect("ptys lock").remove(pty_id);
    }
}

pub(crate) fn winsize(rows: u32, cols: u32) -> Winsize {
    let clamp = |v: u32, default: u16| {
        if v == 0 {
            default
        } else {
            u16::try_from(v).unwrap_or(u16::MAX)
        }
    };
    Winsize {
        ws_row: clamp(rows, 24),
        ws_col: clamp(cols, 80),
        ws_xpixel: 0,
        ws_ypixel: 0,
    }
}

/// A new pty pair: (master, slave).
pub(crate) fn open_pair(size: Winsize) -> std::io::Result<(OwnedFd, OwnedFd)> {
    let master =
        rustix::pty::openpt(OpenptFlags::RDWR | OpenptFlags::NOCTTY | OpenptFlags::CLOEXEC)?;
    rustix::pty::grantpt(&master)?;
    rustix::pty::unlockpt(&master)?;
    let name = rustix::pty::ptsname(&master, Vec::new())?;
    let slave = rustix::fs::open(
        name.as_c_str(),
        OFlags::RDWR | OFlags::NOCTTY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    rustix::termios::tcsetwinsize(&master, size)?;
    Ok((master, slave))
}
