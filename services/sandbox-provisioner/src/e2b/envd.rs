//! envd, the daemon inside each E2B sandbox: its requests, and commands run through it
//! (Connect-RPC `process.Process/Start`, output streamed). Files are `files`.

use super::{E2bBackend, ENVD_PORT, WORKSPACE, connect};
use crate::{
    error::{ProvisionerError, Result},
    limits::OUTPUT_CAP,
};
use base64::{Engine, engine::general_purpose::STANDARD as B64};
use forkyard_proto::sandbox::v1::{ExecEvent, ExecRequest, ExecResponse, exec_event::Event};
use futures::StreamExt;
use reqwest::Method;
use serde_json::{Value, json};
use std::{
    collections::HashMap,
    time::{Duration, Instant},
};
use tokio::sync::mpsc;
use tracing::warn;

impl E2bBackend {
    /// An envd request for sandbox `sid` (its own host, or the base URL + routing headers).
    pub(super) fn envd(&self, sid: &str, method: Method, path: &str) -> reqwest::RequestBuilder {
        let known = self.known(sid);
        let domain = known
            .as_ref()
            .and_then(|k| k.domain.clone())
            .unwrap_or_else(|| self.config.domain.clone());
        let mut rb = if domain.starts_with("http://") || domain.starts_with("https://") {
            self.http
                .request(method, format!("{}{path}", domain.trim_end_matches('/')))
                .header("E2b-Sandbox-Id", sid)
                .header("E2b-Sandbox-Port", ENVD_PORT.to_string())
        } else {
            self.http
                .request(method, format!("https://{ENVD_PORT}-{sid}.{domain}{path}"))
        };
        // envd picks the acting user from basic auth; "user" has no password.
        rb = rb.header("Authorization", format!("Basic {}", B64.encode("user:")));
        if let Some(token) = known.and_then(|k| k.envd_token) {
            rb = rb.header("X-Access-Token", token);
        }
        rb
    }

    /// Run argv in sandbox `sid`, streaming events to `tx`; returns the exit.
    pub(super) async fn run(
        &self,
        sid: &str,
        argv: &[String],
        env: &HashMap<String, String>,
        cwd: &str,
        timeout: Duration,
        tx: Option<&mpsc::Sender<ExecEvent>>,
    ) -> Result<ExecResponse> {
        let started = Instant::now();
        let resp = self.start_process(sid, argv, env, cwd, timeout).await?;
        let mut process = Process::default();
        let mut dec = connect::Decoder::default();
        let mut body = resp.bytes_stream();
        let deadline = tokio::time::sleep(timeout);
        tokio::pin!(deadline);
        let mut timed_out = false;
        'read: loop {
            let chunk = tokio::select! {
                c = body.next() => c,
                () = &mut deadline => { timed_out = true; break 'read; }
            };
            let Some(chunk) = chunk else { break };
            let chunk = chunk.map_err(|e| self.transport_error("process output", &e))?;
            dec.push(&chunk);
            if self.take_frames(&mut dec, &mut process, tx).await? {
                break 'read;
            }
        }
        if timed_out {
            if let Some(pid) = process.pid {
                self.kill_process(sid, pid).await;
            }
        } else if process.exit.is_none() {
            return Err(ProvisionerError::Unavailable(
                "envd process stream ended without an exit".into(),
            ));
        }
        Ok(ExecResponse {
            exit_code: if timed_out {
                -1
            } else {
                process.exit.unwrap_or(-1)
            },
            output_truncated: process.out.truncated || process.err.truncated,
            stdout: String::from_utf8_lossy(&process.out.data).into_owned(),
            stderr: String::from_utf8_lossy(&process.err.data).into_owned(),
            timed_out,
            duration_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
            ..Default::default()
        })
    }

    /// The events of the frames `dec` holds taken into `process` (and sent on `tx`);
    /// `true` once the stream's end frame is reached, `Err` when it carries envd's error.
    async fn take_frames(
        &self,
        dec: &mut connect::Decoder,
        process: &mut Process,
        tx: Option<&mpsc::Sender<ExecEvent>>,
    ) -> Result<bool> {
        while let Some(frame) = dec.next_frame().map_err(ProvisionerError::Unavailable)? {
            let msg: Value = serde_json::from_slice(&frame.data).map_err(|e| {
                ProvisionerError::Unavailable(format!("envd process stream: bad JSON: {e}"))
            })?;
            if frame.flags & connect::FLAG_END_STREAM != 0 {
                if let Some(e) = msg.get("error") {
                    return Err(self.envd_error(e));
                }
                return Ok(true);
            }
            if let Some(ev) = msg.get("event") {
                process.event(ev, tx).await?;
            }
        }
        Ok(false)
    }

    /// envd's `Start` for argv, answered with the stream of the process's events.
    async fn start_process(
        &self,
        sid: &str,
        argv: &[String],
        env: &HashMap<String, String>,
        cwd: &str,
        timeout: Duration,
    ) -> Result<reqwest::Response> {
        let req = json!({
            "process": {"cmd": argv[0], "args": &argv[1..], "envs": env, "cwd": cwd},
        });
        let body = connect::encode(0, &serde_json::to_vec(&req).expect("json"));
        let resp = self
            .envd(sid, Method::POST, "/process.Process/Start")
            .header("Content-Type", "application/connect+json")
            .header("Connect-Protocol-Version", "1")
            .timeout(timeout + self.config.request_timeout)
            .body(body)
            .send()
            .await
            .map_err(|e| self.transport_error("process start", &e))?;
        let status = resp.status();
        if !status.is_success() {
            let text = resp.text().await.unwrap_or_default();
            return Err(self.status_error("process start", "", status, &text));
        }
        Ok(resp)
    }

    /// The error an envd stream ended with, as the provisioner's (scrubbed of the key).
    fn envd_error(&self, e: &Value) -> ProvisionerError {
        let code = e.get("code").and_then(Value::as_str).unwrap_or("unknown");
        let m = e.get("message").and_then(Value::as_str).unwrap_or("");
        let m = self.scrub(m);
        match code {
            "unauthenticated" | "permission_denied" => {
                ProvisionerError::Auth(format!("envd refused the command: {code}: {m}"))
            }
            "invalid_argument" | "not_found" | "failed_precondition" => {
                ProvisionerError::FailedPrecondition(format!("envd: {code}: {m}"))
            }
            _ => ProvisionerError::Unavailable(format!("envd: {code}: {m}")),
        }
    }

    pub(super) async fn kill_process(&self, sid: &str, pid: u64) {
        let body = json!({"process": {"pid": pid}, "signal": "SIGNAL_SIGKILL"});
        let res = self
            .envd(sid, Method::POST, "/process.Process/SendSignal")
            .header("Content-Type", "application/json")
            .header("Connect-Protocol-Version", "1")
            .timeout(self.config.request_timeout)
            .json(&body)
            .send()
            .await;
        if let Err(e) = res {
            warn!(sandbox_id = %sid, pid, error = %self.transport_error("kill", &e), "could not kill a timed-out command");
        }
    }

    /// A command run to its end, its output captured (the tail when asked for).
    pub(super) async fn exec_captured(&self, req: ExecRequest) -> Result<ExecResponse> {
        let (sid, timeout) = self.exec_params(&req)?;
        let mut out = self
            .run(&sid, &req.argv, &req.env, WORKSPACE, timeout, None)
            .await?;
        // envd streams the output here: the tail is cut from what was captured.
        if let Ok(n @ 1..) = usize::try_from(req.output_tail_bytes) {
            for s in [&mut out.stdout, &mut out.stderr] {
                let kept = forkyard_common::text::tail(s, n);
                if kept.len() < s.len() {
                    *s = kept.to_owned();
                    out.output_truncated = true;
                }
            }
        }
        Ok(out)
    }

    /// A command whose output is sent as it comes, its exit last.
    pub(super) fn exec_streamed(&self, req: ExecRequest) -> Result<mpsc::Receiver<ExecEvent>> {
        let (sid, timeout) = self.exec_params(&req)?;
        let (tx, rx) = mpsc::channel(64);
        let this = self.self_arc();
        tokio::spawn(async move {
            let exit = match this
                .run(&sid, &req.argv, &req.env, WORKSPACE, timeout, Some(&tx))
                .await
            {
                Ok(r) => ExecResponse {
                    stdout: String::new(),
                    stderr: String::new(),
                    ..r
                },
                Err(e) => ExecResponse {
                    exit_code: -1,
                    stderr: e.to_string(),
                    ..Default::default()
                },
            };
            let _ = tx
                .send(ExecEvent {
                    event: Some(Event::Exit(exit)),
                })
                .await;
        });
        Ok(rx)
    }

    pub(super) fn exec_params(&self, req: &ExecRequest) -> Result<(String, Duration)> {
        // An E2B sandbox runs outside this host: no relay of ours reaches into it.
        if !req.llm_gateway.is_empty() {
            return Err(ProvisionerError::FailedPrecondition(
                "the e2b backend offers no LLM gateway endpoint inside its sandboxes".into(),
            ));
        }
        crate::validate::argv(&req.argv)?;
        for (k, v) in &req.env {
            crate::validate::env(k, v)?;
        }
        let sid = Self::e2b_id(&req.sandbox_id)?.to_owned();
        let timeout = match req.timeout_secs {
            0 => self.config.exec_timeout,
            s => Duration::from_secs(s.into()),
        };
        Ok((sid, timeout))
    }
}

/// Output capture up to [`OUTPUT_CAP`].
#[derive(Default)]
struct Capture {
    data: Vec<u8>,
    truncated: bool,
}

impl Capture {
    fn push(&mut self, b: &[u8]) {
        let room = OUTPUT_CAP.saturating_sub(self.data.len());
        if b.len() > room {
            self.truncated = true;
        }
        self.data.extend_from_slice(&b[..b.len().min(room)]);
    }
}

/// What a running command has told so far.
#[derive(Default)]
struct Process {
    out: Capture,
    err: Capture,
    pid: Option<u64>,
    exit: Option<i32>,
}

impl Process {
    /// One event of envd's stream: the start (its pid), output (sent on to `tx` too), or
    /// the end (its exit code).
    async fn event(&mut self, ev: &Value, tx: Option<&mpsc::Sender<ExecEvent>>) -> Result<()> {
        if let Some(s) = ev.get("start") {
            self.pid = s.get("pid").and_then(Value::as_u64);
        } else if let Some(d) = ev.get("data") {
            for (key, cap) in [("stdout", &mut self.out), ("stderr", &mut self.err)] {
                if let Some(b) = d.get(key).and_then(Value::as_str) {
                    let bytes = B64.decode(b).map_err(|e| {
                        ProvisionerError::Unavailable(format!("envd {key}: bad base64: {e}"))
                    })?;
                    if let Some(tx) = tx {
                        let e = if key == "stdout" {
                            Event::Stdout(bytes.clone())
                        } else {
                            Event::Stderr(bytes.clone())
                        };
                        let _ = tx.send(ExecEvent { event: Some(e) }).await;
                    }
                    cap.push(&bytes);
                }
            }
        } else if let Some(end) = ev.get("end") {
            // proto3 JSON leaves a zero exitCode out.
            self.exit = Some(
                end.get("exitCode")
                    .and_then(Value::as_i64)
                    .and_then(|c| i32::try_from(c).ok())
                    .unwrap_or(0),
            );
        }
        Ok(())
    }
}
