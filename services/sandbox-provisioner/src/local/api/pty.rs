//! Commands on a pseudo-terminal in a `local` sandbox. Under the sandbox's init
//! (`crate::local::isolation::init`) the init opens the pair in the sandbox's own devpts, sized as
//! asked, runs the command on the slave and sends the master back (checked to be a pty
//! master: the init is the sandbox's), so the command's `ttyname` finds its terminal in
//! the sandbox's /dev/pts; gVisor's init keeps the master and relays it over a stream
//! socket instead, resized by a message (`crate::local::isolation::init`). Without an init (`--sandbox-init false`) the provisioner opens
//! the pair (rustix: openpt/grantpt/unlockpt/ptsname — no unsafe) on the host's devpts
//! and hands the slave to a bubblewrap of the command's own; `tty` then says "not a tty".
//! Either way the provisioner keeps the master: output is streamed, `WritePty` writes to
//! it, `ResizePty` sets its window size (TIOCSWINSZ). The command runs in a session of
//! its own whose controlling terminal is the pty (the init's `--ctty` helper; without an
//! init, util-linux `setsid --wait --ctty` from the host's /usr), so ^C becomes SIGINT and
//! a resize SIGWINCH for its foreground process group, as on any terminal. (Only the
//! sandbox reads that terminal, so TIOCSTI on it reaches nothing outside.) A command
//! killed by signal N exits 128+N. Without an init and without `/usr/bin/setsid` on the
//! host the command runs without a controlling terminal (no ^C, no SIGWINCH).
//! The command dies when the stream is dropped (hang-up), on timeout, and when the
//! sandbox is stopped or destroyed.

use crate::error::{ProvisionerError, Result};
use crate::local::{
    core::{
        prepare::{Prepared, Tools},
        provisioner::Provisioner,
    },
    isolation::{
        command::{
            launch::Running,
            terminal::{Pty, open_pair, winsize},
        },
        init::host::Stdio3,
    },
    storage::disk_watch,
};
use forkyard_proto::sandbox::v1::{
    PtyEvent, ResizePtyRequest, ResizePtyResponse, StartPtyRequest, WritePtyRequest,
    WritePtyResponse, pty_event::Event,
};
use std::{io::Read, sync::Arc, time::Duration};
use tokio::sync::mpsc;

impl Provisioner {
    pub(crate) fn pty(&self, sandbox_id: &str, pty_id: &str) -> Result<Arc<Pty>> {
        self.ptys
            .get(sandbox_id, pty_id)
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
        let mut p = self.prepare(&req.sandbox_id, &req.argv, &env, "", Tools::Sandbox, true)?;
        let size = winsize(req.rows, req.cols);
        let launch = p.launch.take().expect("prepared once");
        let started = |e| ProvisionerError::internal("cannot start the command", e);
        let (master, mut running) = if launch.opens_own_pty() || launch.relays_pty() {
            // Opened by the init in the sandbox's own devpts: `tty` and anything else
            // that looks its terminal up by name finds it there. gVisor's init relays it.
            let (rows, cols) = (size.ws_row, size.ws_col);
            let stdio = if launch.opens_own_pty() {
                Stdio3::OwnPty { rows, cols }
            } else {
                Stdio3::RelayedPty { rows, cols }
            };
            let mut running = launch.spawn(stdio).await.map_err(started)?;
            let master = running.pty_master.take().expect("a master with OwnPty");
            (master, running)
        } else {
            let (master, slave) =
                open_pair(size).map_err(|e| ProvisionerError::internal("open a pty", e))?;
            // The slave goes with the launch: no copy of it stays here, so reads of the
            // master see EIO once the command is gone.
            let running = launch.spawn(Stdio3::Pty(slave)).await.map_err(started)?;
            (master, running)
        };
        let master = std::fs::File::from(master);
        let reader = master
            .try_clone()
            .map_err(|e| ProvisionerError::internal("dup pty", e))?;
        let pty_id = self
            .ptys
            .add(&req.sandbox_id, master, running.resizer.take());

        let (tx, rx) = mpsc::channel(64);
        let _ = tx
            .send(PtyEvent {
                event: Some(Event::PtyId(pty_id.clone())),
            })
            .await;
        let output = read_master(reader);
        tokio::spawn(
            self.clone()
                .follow_pty(p, running, pty_id, output, tx, timeout),
        );
        Ok(rx)
    }

    /// Stream the command's output until it exits, times out, outgrows its disk, is
    /// cancelled or its caller hangs up; then what it left in the terminal, and its exit.
    async fn follow_pty(
        self: Arc<Self>,
        p: Prepared,
        mut running: Running,
        pty_id: String,
        mut out_rx: mpsc::Receiver<Vec<u8>>,
        tx: mpsc::Sender<PtyEvent>,
        timeout: Duration,
    ) {
        let record = p.entry.record();
        let over_disk =
            disk_watch::over_limit(self.storage.store.own_files(&record), record.disk_bytes);
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
        self.ptys.remove(&pty_id);
        drain_output(&mut out_rx, &tx).await;
        let exit = self
            .aftermath(&p)
            .await
            .exit(exit_code, timed_out, started.elapsed());
        let _ = tx
            .send(PtyEvent {
                event: Some(Event::Exit(exit)),
            })
            .await;
        drop(p);
    }

    pub async fn write_pty(&self, req: WritePtyRequest) -> Result<WritePtyResponse> {
        let pty = self.pty(&req.sandbox_id, &req.pty_id)?;
        let len = req.data.len() as u64;
        tokio::task::spawn_blocking(move || pty.write(&req.data))
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
        pty.resize(req.rows, req.cols)
            .map_err(|e| ProvisionerError::internal("resize pty", e))?;
        Ok(ResizePtyResponse {})
    }
}

/// Blocking reads on the master, on their own thread; EIO once the slave is closed.
fn read_master(mut reader: std::fs::File) -> mpsc::Receiver<Vec<u8>> {
    let (out_tx, out_rx) = mpsc::channel::<Vec<u8>>(64);
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
    out_rx
}

/// What the command wrote before it went (the reader ends at EIO), for at most two
/// seconds: a process that left the command may hold the terminal open.
async fn drain_output(out_rx: &mut mpsc::Receiver<Vec<u8>>, tx: &mpsc::Sender<PtyEvent>) {
    let drain_until = tokio::time::Instant::now() + Duration::from_secs(2);
    while let Ok(Some(b)) = tokio::time::timeout_at(
        drain_until.min(tokio::time::Instant::now() + Duration::from_millis(200)),
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
}
