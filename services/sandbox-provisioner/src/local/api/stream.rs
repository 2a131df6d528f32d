//! Exec with stdout and stderr streamed as they come. The command dies when it times
//! out, when the sandbox is stopped or destroyed, and when the receiver is dropped (the
//! gRPC caller hung up).

use crate::{
    error::{ProvisionerError, Result},
    local::{
        base::read_buf::ReadBuf,
        core::{
            prepare::{Prepared, Tools},
            provisioner::Provisioner,
        },
        isolation::{command::launch::Running, init::host::Stdio3},
        storage::disk_watch,
    },
};
use forkyard_proto::sandbox::v1::{ExecEvent, ExecRequest, exec_event::Event};
use std::{sync::Arc, time::Duration};

use tokio::{io::AsyncReadExt, sync::mpsc};
use tracing::Instrument as _;

/// How long output is still read after the command exited.
const DRAIN_AFTER_EXIT: Duration = Duration::from_secs(2);

impl Provisioner {
    /// Start the command; events arrive on the returned channel, the exit last.
    pub async fn exec_stream(
        self: &Arc<Self>,
        req: ExecRequest,
    ) -> Result<mpsc::Receiver<ExecEvent>> {
        let (env, timeout) = self.exec_params(&req.argv, &req.env, req.timeout_secs)?;
        // Open until the exit is sent; as in `run_checked`, the program but no argument.
        let span = tracing::info_span!(
            "sandbox.exec",
            sandbox_id = %req.sandbox_id,
            program = req.argv.first().map_or("", String::as_str),
            streamed = true,
            exit_code = tracing::field::Empty,
        );
        let mut p = self.prepare(
            &req.sandbox_id,
            &req.argv,
            &env,
            &req.llm_gateway,
            Tools::Sandbox,
            false,
        )?;
        let running = p
            .launch
            .take()
            .expect("prepared once")
            .spawn(Stdio3::Piped)
            .await
            .map_err(|e| ProvisionerError::internal("cannot start the command", e))?;
        let (tx, rx) = mpsc::channel(64);
        tokio::spawn(
            self.clone()
                .follow_exec(p, running, tx, timeout)
                .instrument(span),
        );
        Ok(rx)
    }

    /// Send the command's output until it ends; then what the limits did, and its exit.
    async fn follow_exec(
        self: Arc<Self>,
        p: Prepared,
        mut running: Running,
        tx: mpsc::Sender<ExecEvent>,
        timeout: Duration,
    ) {
        let started = std::time::Instant::now();
        let (status, timed_out) = relay_output(&p, &mut running, &tx, timeout, &self).await;
        let exit_code = match status {
            Some(code) => code,
            None => {
                running.kill().await;
                -1
            }
        };
        tracing::Span::current().record("exit_code", exit_code);
        let exit = self
            .aftermath(&p)
            .await
            .exit(exit_code, timed_out, started.elapsed());
        let _ = tx
            .send(ExecEvent {
                event: Some(Event::Exit(exit)),
            })
            .await;
        drop(p);
    }
}

/// Stdout and stderr sent as they come, until the command exits (and its pipes are
/// drained), times out, outgrows its disk, is cancelled or its caller hangs up. Returns
/// its exit code (`None`: it is still to be killed) and whether it timed out.
async fn relay_output(
    p: &Prepared,
    running: &mut Running,
    tx: &mpsc::Sender<ExecEvent>,
    timeout: Duration,
    core: &Provisioner,
) -> (Option<i32>, bool) {
    let record = p.entry.record();
    let over_disk =
        disk_watch::over_limit(core.storage.store.own_files(&record), record.disk_bytes);
    let mut out = running.stdout.take().expect("piped");
    let mut err = running.stderr.take().expect("piped");
    let (mut ob, mut eb) = (ReadBuf::new(32 * 1024), ReadBuf::new(32 * 1024));
    let (mut out_open, mut err_open) = (true, true);
    let deadline = tokio::time::sleep(timeout);
    tokio::pin!(deadline, over_disk);
    let mut timed_out = false;
    // After the exit, what the pipes still hold is sent, for a bounded time (a
    // process that left the command's group may hold them open).
    let mut drain: Option<std::pin::Pin<Box<tokio::time::Sleep>>> = None;
    let mut exited = None;
    let status = loop {
        if !out_open
            && !err_open
            && let Some(code) = exited
        {
            break Some(code);
        }
        tokio::select! {
            n = out.read(ob.space()), if out_open => match n {
                Ok(0) | Err(_) => out_open = false,
                Ok(n) => if tx.send(ExecEvent { event: Some(Event::Stdout(ob.took(n).to_vec())) }).await.is_err() { break None },
            },
            n = err.read(eb.space()), if err_open => match n {
                Ok(0) | Err(_) => err_open = false,
                Ok(n) => if tx.send(ExecEvent { event: Some(Event::Stderr(eb.took(n).to_vec())) }).await.is_err() { break None },
            },
            code = running.wait(), if exited.is_none() => {
                exited = Some(code);
                drain = Some(Box::pin(tokio::time::sleep(DRAIN_AFTER_EXIT)));
            },
            () = async { drain.as_mut().expect("armed").await }, if drain.is_some() => break exited,
            () = &mut deadline, if exited.is_none() => { timed_out = true; break None },
            bytes = &mut over_disk, if exited.is_none() => {
                tracing::warn!(sandbox_id = %record.id, bytes, "command stopped: workspace over its disk limit");
                break None
            },
            () = p.cancel.cancelled(), if exited.is_none() => break None,
            () = tx.closed() => break None,
        }
    };
    (status, timed_out)
}
