//! Commands on a pseudo-terminal in a `local` sandbox. The provisioner opens the pty pair
//! (rustix: openpt/grantpt/unlockpt/ptsname — no unsafe), hands the slave to the
//! sandbox's init (`crate::local::init`; or to a bubblewrap of the command's own) as
//! stdin/stdout/stderr and keeps the master: output is streamed, `WritePty` writes to it,
//! `ResizePty` sets its window size (TIOCSWINSZ). The command runs in a session of its
//! own whose controlling terminal is the pty (the init's `--ctty` helper; without an init,
//! util-linux `setsid --wait --ctty` from the host's /usr), so ^C becomes SIGINT and a
//! resize SIGWINCH for its foreground process group, as on any terminal. (Only the
//! sandbox reads that terminal, so TIOCSTI on it reaches nothing outside.) A command
//! killed by signal N exits 128+N. Without an init and without `/usr/bin/setsid` on the
//! host the command runs without a controlling terminal (no ^C, no SIGWINCH).
//! The command dies when the stream is dropped (hang-up), on timeout, and when the
//! sandbox is stopped or destroyed.

use crate::{
    error::{ProvisionerError, Result},
    local::{init::host::Stdio3, provisioner::Provisioner},
};
use forkyard_proto::sandbox::v1::{
    PtyEvent, ResizePtyRequest, ResizePtyResponse, StartPtyRequest, WritePtyRequest,
    WritePtyResponse, pty_event::Event,
};
use rustix::{
    fd::OwnedFd,
    fs::{Mode, OFlags},
    pty::OpenptFlags,
    termios::Winsize,
};
use std::{
    collections::HashMap,
    io::{Read, Write},
    sync::{Arc, Mutex},
};
use tokio::sync::mpsc;

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
}

/// Open pty sessions by id.
#[derive(Default)]
pub(crate) struct Ptys(Mutex<HashMap<String, Arc<Pty>>>);

fn winsize(rows: u32, cols: u32) -> Winsize {
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
fn open_pair(size: Winsize) -> std::io::Result<(OwnedFd, OwnedFd)> {
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

impl Provisioner {
    pub(crate) fn pty(&self, sandbox_id: &str, pty_id: &str) -> Result<Arc<Pty>> {
        self.ptys
            .0
            .lock()
            .expect("ptys lock")
            .get(pty_id)
            .filter(|p| p.sandbox_id == sandbox_id)
            .cloned()
            .ok_or_else(|| ProvisionerError::NotFound(format!("pty {pty_id} in {sandbox_id}")))
    }

    /// Start the command on a new pty; events arrive on the returned channel.
    pub async fn start_pty(
        self: &Arc<Self>,
        req: StartPtyRequest,
    ) -> Result<mpsc::Receiver<PtyEvent>> {
        let mut env_map = req.env.clone();
        env_map
            .entry("TERM".into())
            .or_insert_with(|| "xterm-256color".into());
        let (env, timeout) = self.exec_params(&req.argv, &env_map, req.timeout_secs)?;
        let mut p = self.prepare(
            &req.sandbox_id,
            &req.argv,
            &env,
            "",
            crate::local::exec::Tools::Sandbox,
            true,
        )?;
        let (master, slave) = open_pair(winsize(req.rows, req.cols))
            .map_err(|e| ProvisionerError::internal("open a pty", e))?;
        // The slave goes with the launch: no copy of it stays here, so reads of the
        // master see EIO once the command is gone.
        let mut running = p
            .launch
            .take()
            .expect("prepared once")
            .spawn(Stdio3::Pty(slave))
            .await
            .map_err(|e| ProvisionerError::internal("cannot start the command", e))?;
        let master = std::fs::File::from(master);
        let mut reader = master
            .try_clone()
            .map_err(|e| ProvisionerError::internal("dup pty", e))?;
        let pty_id = format!("pty-{}", uuid::Uuid::new_v4().simple());
        let pty = Arc::new(Pty {
            sandbox_id: req.sandbox_id.clone(),
            master: Mutex::new(master),
        });
        self.ptys
            .0
            .lock()
            .expect("ptys lock")
            .insert(pty_id.clone(), pty);

        let (tx, rx) = mpsc::channel(64);
        let _ = tx
            .send(PtyEvent {
                event: Some(Event::PtyId(pty_id.clone())),
            })
            .await;
        // Blocking reads on the master, on their own thread; EIO once the slave is closed.
        let (out_tx, mut out_rx) = mpsc::channel::<Vec<u8>>(64);
        std::thread::spawn(move || {
            let mut buf = vec![0u8; 16 * 1024];
            loop {
                match reader.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        if out_tx.blocking_send(buf[..n].to_vec()).is_err() {
                            break;
                        }
                    }
                }
            }
        });
        let core = self.clone();
        let record = p.entry.record();
        let over_disk = crate::local::disk_watch::over_limit(
            self.store.workspace(&record.id),
            record.disk_bytes,
        );
        tokio::spawn(async move {
            let started = std::time::Instant::now();
            let deadline = tokio::time::sleep(timeout);
            tokio::pin!(deadline, over_disk);
            let mut timed_out = false;
            let mut out_open = true;
            let status = loop {
                tokio::select! {
                    chunk = out_rx.recv(), if out_open => match chunk {
                        Some(b) => if tx.send(PtyEvent { event: Some(Event::Output(b)) }).await.is_err() { break None },
                        None => out_open = false,
                    },
                    code = running.wait() => break Some(code),
                    () = &mut deadline => { timed_out = true; break None },
                    bytes = &mut over_disk => {
                        tracing::warn!(sandbox_id = %record.id, bytes, "session command stopped: workspace over its disk limit");
                        break None
                    },
                    () = p.cancel.cancelled() => break None,
                    () = tx.closed() => break None,
                }
            };
            let exit_code = match status {
                Some(code) => code,
                None => {
                    running.kill().await;
                    -1
                }
            };
            core.ptys.0.lock().expect("ptys lock").remove(&pty_id);
            // What the command wrote before it went (the reader ends at EIO), for at most
            // two seconds: a process that left the command may hold the terminal open.
            let drain_until = tokio::time::Instant::now() + std::time::Duration::from_secs(2);
            while let Ok(Some(b)) = tokio::time::timeout_at(
                drain_until
                    .min(tokio::time::Instant::now() + std::time::Duration::from_millis(200)),
                out_rx.recv(),
            )
            .await
            {
                let sent = tx
                    .send(PtyEvent {
                        event: Some(Event::Output(b)),
                    })
                    .await;
                if sent.is_err() {
                    break;
                }
            }
            let exit = core
                .aftermath(&p)
                .await
                .exit(exit_code, timed_out, started.elapsed());
            let _ = tx
                .send(PtyEvent {
                    event: Some(Event::Exit(exit)),
                })
                .await;
            drop(p);
        });
        Ok(rx)
    }

    pub async fn write_pty(&self, req: WritePtyRequest) -> Result<WritePtyResponse> {
        let pty = self.pty(&req.sandbox_id, &req.pty_id)?;
        let len = req.data.len() as u64;
        tokio::task::spawn_blocking(move || {
            let mut m = pty.master.lock().expect("pty lock");
            m.write_all(&req.data)
        })
        .await
        .map_err(|e| ProvisionerError::internal("write pty", e))?
        .map_err(|e| ProvisionerError::FailedPrecondition(format!("pty closed: {e}")))?;
        Ok(WritePtyResponse { bytes_written: len })
    }

    pub async fn resize_pty(&self, req: ResizePtyRequest) -> Result<ResizePtyResponse> {
        if req.rows == 0 || req.cols == 0 {
            return Err(ProvisionerError::invalid(
                "rows",
                "rows and cols must be at least 1",
            ));
        }
        let pty = self.pty(&req.sandbox_id, &req.pty_id)?;
        let m = pty.master.lock().expect("pty lock");
        rustix::termios::tcsetwinsize(&*m, winsize(req.rows, req.cols))
            .map_err(|e| ProvisionerError::internal("resize pty", e))?;
        Ok(ResizePtyResponse {})
    }
}
