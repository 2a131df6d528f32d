//! Exec with stdout and stderr streamed as they come. The command dies when it times
//! out, when the sandbox is stopped or destroyed, and when the receiver is dropped (the
//! gRPC caller hung up).

use crate::{
    error::{ProvisionerError, Result},
    process::KillTree,
    provisioner::Provisioner,
};
use forkyard_proto::sandbox::v1::{ExecEvent, ExecRequest, exec_event::Event};
use std::{process::Stdio, sync::Arc};
use tokio::{io::AsyncReadExt, sync::mpsc};

impl Provisioner {
    /// Start the command; events arrive on the returned channel, the exit last.
    pub async fn exec_stream(
        self: &Arc<Self>,
        req: ExecRequest,
    ) -> Result<mpsc::Receiver<ExecEvent>> {
        let (env, timeout) = self.exec_params(&req.argv, &req.env, req.timeout_secs)?;
        let mut p = self.prepare(
            &req.sandbox_id,
            &req.argv,
            &env,
            &req.llm_gateway,
            crate::exec::Tools::Sandbox,
        )?;
        p.command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = p
            .command
            .spawn()
            .map_err(|e| ProvisionerError::internal("cannot start bwrap", e))?;
        let (tx, rx) = mpsc::channel(64);
        let core = self.clone();
        let record = p.entry.record();
        let over_disk =
            crate::disk_watch::over_limit(self.store.workspace(&record.id), record.disk_bytes);
        tokio::spawn(async move {
            let started = std::time::Instant::now();
            let mut tree = KillTree(child.id());
            let mut out = child.stdout.take().expect("piped");
            let mut err = child.stderr.take().expect("piped");
            let (mut ob, mut eb) = (vec![0u8; 32 * 1024], vec![0u8; 32 * 1024]);
            let (mut out_open, mut err_open) = (true, true);
            let deadline = tokio::time::sleep(timeout);
            tokio::pin!(deadline, over_disk);
            let mut timed_out = false;
            let status = loop {
                tokio::select! {
                    n = out.read(&mut ob), if out_open => match n {
                        Ok(0) | Err(_) => out_open = false,
                        Ok(n) => if tx.send(ExecEvent { event: Some(Event::Stdout(ob[..n].to_vec())) }).await.is_err() { break None },
                    },
                    n = err.read(&mut eb), if err_open => match n {
                        Ok(0) | Err(_) => err_open = false,
                        Ok(n) => if tx.send(ExecEvent { event: Some(Event::Stderr(eb[..n].to_vec())) }).await.is_err() { break None },
                    },
                    s = child.wait(), if !out_open && !err_open => break s.ok(),
                    () = &mut deadline => { timed_out = true; break None },
                    bytes = &mut over_disk => {
                        tracing::warn!(sandbox_id = %req.sandbox_id, bytes, "command stopped: workspace over its disk limit");
                        break None
                    },
                    () = p.cancel.cancelled() => break None,
                    () = tx.closed() => break None,
                }
            };
            let exit_code = match status {
                Some(s) => {
                    tree.disarm();
                    s.code().unwrap_or(-1)
                }
                None => {
                    tree.kill();
                    let _ = child.start_kill();
                    let _ = child.wait().await;
                    -1
                }
            };
            let exit = core
                .aftermath(&p)
                .await
                .exit(exit_code, timed_out, started.elapsed());
            let _ = tx
                .send(ExecEvent {
                    event: Some(Event::Exit(exit)),
                })
                .await;
            drop(p);
        });
        Ok(rx)
    }
}
