//! Pseudo-terminals over envd's process API: `process.Process/Start` with a `pty` size
//! (output arrives as `data.pty`), `SendInput` with `input.pty` for keystrokes and
//! `Update` with a new `pty.size` for resizes. envd gives the command the pty as its
//! controlling terminal, so ^C (0x03) interrupts it as on a local terminal. The pty id
//! handed out is ours; it maps to the sandbox and envd's pid of the command.

use super::{E2bBackend, WORKSPACE, connect};
use crate::error::{ProvisionerError, Result};
use base64::{Engine, engine::general_purpose::STANDARD as B64};
use bytes::Bytes;
use forkyard_proto::sandbox::v1::{
    ExecRequest, ExecResponse, PtyEvent, ResizePtyRequest, ResizePtyResponse, StartPtyRequest,
    WritePtyRequest, WritePtyResponse, pty_event::Event,
};
use futures::{Stream, StreamExt};
use reqwest::Method;
use serde_json::{Value, json};
use std::{sync::Arc, time::Instant};
use tokio::sync::mpsc;
use tracing::warn;

fn size(rows: u32, cols: u32) -> Value {
    let or = |v: u32, d: u32| {
        if v == 0 {
            d
        } else {
            v.min(u32::from(u16::MAX))
        }
    };
    json!({"cols": or(cols, 80), "rows": or(rows, 24)})
}

/// Go's names of the signals a terminal user sends or a command dies of most.
const SIGNALS: &[(&str, i64)] = &[
    ("hangup", 1),
    ("interrupt", 2),
    ("quit", 3),
    ("aborted", 6),
    ("killed", 9),
    ("segmentation fault", 11),
    ("broken pipe", 13),
    ("terminated", 15),
];

/// The exit code of an `end` event, shell-style: proto3 JSON leaves a zero `exitCode`
/// out; envd reports a signal death as -1 with status "signal: <name>" (Go's wording),
/// made 128 + N here like the local backend's.
fn end_code(end: &Value) -> i64 {
    let code = end["exitCode"].as_i64().unwrap_or(0);
    if code != -1 {
        return code;
    }
    let status = end["status"].as_str().unwrap_or("");
    status
        .strip_prefix("signal: ")
        .and_then(|name| SIGNALS.iter().find(|(n, _)| *n == name))
        .map_or(-1, |(_, n)| 128 + n)
}

/// A pty command envd started.
struct Running {
    /// The E2B sandbox id.
    sid: String,
    pid: u64,
    pty_id: String,
    timeout: std::time::Duration,
}

impl E2bBackend {
    fn pty_target(&self, sandbox_id: &str, pty_id: &str) -> Result<(String, u64)> {
        self.ptys
            .lock()
            .expect("ptys lock")
            .get(pty_id)
            .filter(|(sid, _)| format!("{}{sid}", super::ID_PREFIX) == sandbox_id)
            .cloned()
            .ok_or_else(|| ProvisionerError::NotFound(format!("pty {pty_id} in {sandbox_id}")))
    }

    /// A unary Connect call to envd (JSON body, JSON answer).
    async fn envd_unary(&self, sid: &str, method: &str, body: Value) -> Result<()> {
        let path = format!("/process.Process/{method}");
        let resp = self
            .envd(sid, Method::POST, &path)
            .header("Content-Type", "application/json")
            .header("Connect-Protocol-Version", "1")
            .timeout(self.config.request_timeout)
            .json(&body)
            .send()
            .await
            .map_err(|e| self.transport_error(method, &e))?;
        let status = resp.status();
        if !status.is_success() {
            let text = resp.text().await.unwrap_or_default();
            return Err(self.status_error(method, "", status, &text));
        }
        Ok(())
    }

    pub(super) async fn pty_start(&self, req: StartPtyRequest) -> Result<mpsc::Receiver<PtyEvent>> {
        let mut env = req.env.clone();
        env.entry("TERM".into())
            .or_insert_with(|| "xterm-256color".into());
        let (sid, timeout) = self.exec_params(&ExecRequest {
            sandbox_id: req.sandbox_id.clone(),
            argv: req.argv.clone(),
            env: env.clone(),
            timeout_secs: req.timeout_secs,
            ..Default::default()
        })?;
        let start = json!({
            "process": {"cmd": req.argv[0], "args": &req.argv[1..], "envs": env, "cwd": WORKSPACE},
            "pty": {"size": size(req.rows, req.cols)},
        });
        let body = connect::encode(0, &serde_json::to_vec(&start).expect("json"));
        let resp = self
            .envd(&sid, Method::POST, "/process.Process/Start")
            .header("Content-Type", "application/connect+json")
            .header("Connect-Protocol-Version", "1")
            .timeout(timeout + self.config.request_timeout)
            .body(body)
            .send()
            .await
            .map_err(|e| self.transport_error("pty start", &e))?;
        let status = resp.status();
        if !status.is_success() {
            let text = resp.text().await.unwrap_or_default();
            return Err(self.status_error("pty start", &req.sandbox_id, status, &text));
        }
        // Wait for envd's start event (or its error) so that a refused command is an
        // error of this call, and the first event handed out names the pty.
        let mut dec = connect::Decoder::default();
        let mut stream = resp.bytes_stream();
        let (pid, early) = self.started(&mut stream, &mut dec).await?;
        let pty_id = format!("pty-{}", uuid::Uuid::new_v4().simple());
        self.ptys
            .lock()
            .expect("ptys lock")
            .insert(pty_id.clone(), (sid.clone(), pid));
        let (tx, rx) = mpsc::channel(64);
        let _ = tx
            .send(PtyEvent {
                event: Some(Event::PtyId(pty_id.clone())),
            })
            .await;
        let pty = Running {
            sid,
            pid,
            pty_id,
            timeout,
        };
        tokio::spawn(self.self_arc().follow(pty, stream, dec, early, tx));
        Ok(rx)
    }

    /// The command's pid, from envd's start event, and the messages decoded after it.
    async fn started(
        &self,
        stream: &mut (impl Stream<Item = reqwest::Result<Bytes>> + Unpin),
        dec: &mut connect::Decoder,
    ) -> Result<(u64, Vec<Value>)> {
        let mut early = Vec::new();
        loop {
            let Some(chunk) = stream.next().await else {
                return Err(ProvisionerError::Unavailable(
                    "envd pty stream ended before the command started".into(),
                ));
            };
            let chunk = chunk.map_err(|e| self.transport_error("pty start", &e))?;
            dec.push(&chunk);
            while let Some(frame) = dec.next_frame().map_err(ProvisionerError::Unavailable)? {
                let msg: Value = serde_json::from_slice(&frame.data).unwrap_or_default();
                if frame.flags & connect::FLAG_END_STREAM != 0 {
                    let code = msg["error"]["code"].as_str().unwrap_or("unknown");
                    let m = self.scrub(msg["error"]["message"].as_str().unwrap_or(""));
                    return Err(ProvisionerError::FailedPrecondition(format!(
                        "envd refused the pty command: {code}: {m}"
                    )));
                }
                if let Some(p) = msg["event"]["start"]["pid"].as_u64() {
                    return Ok((p, early));
                }
                early.push(msg);
            }
        }
    }

    /// Stream the command's output until it ends, times out, its stream breaks or its
    /// caller hangs up (then it is killed); its exit last.
    async fn follow(
        self: Arc<Self>,
        pty: Running,
        mut stream: impl Stream<Item = reqwest::Result<Bytes>> + Unpin,
        mut dec: connect::Decoder,
        early: Vec<Value>,
        tx: mpsc::Sender<PtyEvent>,
    ) {
        let started = Instant::now();
        let deadline = tokio::time::sleep(pty.timeout);
        tokio::pin!(deadline);
        let (mut exit, mut timed_out) = (None, false);
        // Frames already decoded after the start event come first.
        let mut pending: std::collections::VecDeque<Value> = early.into();
        'read: loop {
            if decode_frames(&mut dec, &mut pending)
                || !send_output(&mut pending, &tx, &mut exit).await
            {
                break 'read;
            }
            let chunk = tokio::select! {
                c = stream.next() => c,
                () = &mut deadline => { timed_out = true; break 'read; }
                () = tx.closed() => break 'read,
            };
            let Some(Ok(chunk)) = chunk else { break };
            dec.push(&chunk);
        }
        self.ptys.lock().expect("ptys lock").remove(&pty.pty_id);
        if exit.is_none() {
            // Timeout, hang-up or a broken stream: the command must not outlive it.
            self.kill_process(&pty.sid, pty.pid).await;
            if !timed_out && !tx.is_closed() {
                warn!(sandbox_id = %pty.sid, "envd pty stream ended without an exit");
            }
        }
        let exit = ExecResponse {
            exit_code: exit.and_then(|c| i32::try_from(c).ok()).unwrap_or(-1),
            timed_out,
            duration_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
            ..Default::default()
        };
        let _ = tx
            .send(PtyEvent {
                event: Some(Event::Exit(exit)),
            })
            .await;
    }

    pub(super) async fn pty_write(&self, req: WritePtyRequest) -> Result<WritePtyResponse> {
        let (sid, pid) = self.pty_target(&req.sandbox_id, &req.pty_id)?;
        let body = json!({"process": {"pid": pid}, "input": {"pty": B64.encode(&req.data)}});
        self.envd_unary(&sid, "SendInput", body).await?;
        Ok(WritePtyResponse {
            bytes_written: req.data.len() as u64,
        })
    }

    pub(super) async fn pty_resize(&self, req: ResizePtyRequest) -> Result<ResizePtyResponse> {
        if req.rows == 0 || req.cols == 0 {
            return Err(ProvisionerError::invalid(
                "rows",
                "rows and cols must be at least 1",
            ));
        }
        let (sid, pid) = self.pty_target(&req.sandbox_id, &req.pty_id)?;
        let body = json!({"process": {"pid": pid}, "pty": {"size": size(req.rows, req.cols)}});
        self.envd_unary(&sid, "Update", body).await?;
        Ok(ResizePtyResponse {})
    }
}

/// The frames `dec` holds decoded, their messages queued on `pending`; `true` once the
/// stream's end frame is reached.
fn decode_frames(
    dec: &mut connect::Decoder,
    pending: &mut std::collections::VecDeque<Value>,
) -> bool {
    while let Some(frame) = dec.next_frame().ok().flatten() {
        if frame.flags & connect::FLAG_END_STREAM != 0 {
            return true;
        }
        if let Ok(msg) = serde_json::from_slice::<Value>(&frame.data) {
            pending.push_back(msg);
        }
    }
    false
}

/// The output in `pending`'s messages sent on `tx`, an end's code kept in `exit`;
/// `false` once the caller hung up.
async fn send_output(
    pending: &mut std::collections::VecDeque<Value>,
    tx: &mpsc::Sender<PtyEvent>,
    exit: &mut Option<i64>,
) -> bool {
    while let Some(msg) = pending.pop_front() {
        let ev = &msg["event"];
        if let Some(b) = ev["data"]["pty"].as_str() {
            let Ok(bytes) = B64.decode(b) else { continue };
            let out = PtyEvent {
                event: Some(Event::Output(bytes)),
            };
            if tx.send(out).await.is_err() {
                return false;
            }
        } else if ev.get("end").is_some() {
            *exit = Some(end_code(&ev["end"]));
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::end_code;
    use serde_json::json;

    #[test]
    fn end_codes_are_shell_style() {
        assert_eq!(
            end_code(&json!({"exited": true, "status": "exit status 0"})),
            0
        );
        assert_eq!(
            end_code(&json!({"exitCode": 3, "status": "exit status 3"})),
            3
        );
        assert_eq!(
            end_code(&json!({"exitCode": -1, "status": "signal: interrupt"})),
            130
        );
        assert_eq!(
            end_code(&json!({"exitCode": -1, "status": "signal: killed"})),
            137
        );
        assert_eq!(
            end_code(&json!({"exitCode": -1, "status": "signal: user defined signal 1"})),
            -1
        );
    }
}
