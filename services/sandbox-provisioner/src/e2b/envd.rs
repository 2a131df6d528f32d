//! envd, the daemon inside each E2B sandbox: commands (Connect-RPC
//! `process.Process/Start`, output streamed) and files (`GET/POST /files`).

use super::{E2bBackend, ENVD_PORT, WORKSPACE, connect};
use crate::{
    error::{ProvisionerError, Result},
    limits::OUTPUT_CAP,
};
use base64::{Engine, engine::general_purpose::STANDARD as B64};
use forkyard_proto::sandbox::v1::{ExecEvent, ExecRequest, ExecResponse, exec_event::Event};
use futures::StreamExt;
use reqwest::{Method, StatusCode};
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
        let mut out = Capture::default();
        let mut err = Capture::default();
        let mut pid: Option<u64> = None;
        let mut exit: Option<i32> = None;
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
            while let Some(frame) = dec.next_frame().map_err(ProvisionerError::Unavailable)? {
                let msg: Value = serde_json::from_slice(&frame.data).map_err(|e| {
                    ProvisionerError::Unavailable(format!("envd process stream: bad JSON: {e}"))
                })?;
                if frame.flags & connect::FLAG_END_STREAM != 0 {
                    if let Some(e) = msg.get("error") {
                        let code = e.get("code").and_then(Value::as_str).unwrap_or("unknown");
                        let m = e.get("message").and_then(Value::as_str).unwrap_or("");
                        let m = self.scrub(m);
                        return Err(match code {
                            "unauthenticated" | "permission_denied" => ProvisionerError::Auth(
                                format!("envd refused the command: {code}: {m}"),
                            ),
                            "invalid_argument" | "not_found" | "failed_precondition" => {
                                ProvisionerError::FailedPrecondition(format!("envd: {code}: {m}"))
                            }
                            _ => ProvisionerError::Unavailable(format!("envd: {code}: {m}")),
                        });
                    }
                    break 'read;
                }
                let Some(ev) = msg.get("event") else { continue };
                if let Some(s) = ev.get("start") {
                    pid = s.get("pid").and_then(Value::as_u64);
                } else if let Some(d) = ev.get("data") {
                    for (key, cap) in [("stdout", &mut out), ("stderr", &mut err)] {
                        if let Some(b) = d.get(key).and_then(Value::as_str) {
                            let bytes = B64.decode(b).map_err(|e| {
                                ProvisionerError::Unavailable(format!(
                                    "envd {key}: bad base64: {e}"
                                ))
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
                    exit = Some(
                        end.get("exitCode")
                            .and_then(Value::as_i64)
                            .and_then(|c| i32::try_from(c).ok())
                            .unwrap_or(0),
                    );
                }
            }
        }
        if timed_out {
            if let Some(pid) = pid {
                self.kill_process(sid, pid).await;
            }
        } else if exit.is_none() {
            return Err(ProvisionerError::Unavailable(
                "envd process stream ended without an exit".into(),
            ));
        }
        Ok(ExecResponse {
            exit_code: if timed_out { -1 } else { exit.unwrap_or(-1) },
            output_truncated: out.truncated || err.truncated,
            stdout: String::from_utf8_lossy(&out.data).into_owned(),
            stderr: String::from_utf8_lossy(&err.data).into_owned(),
            timed_out,
            duration_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
            ..Default::default()
        })
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

    pub(super) async fn read_bytes(&self, sid: &str, path: &str) -> Result<Vec<u8>> {
        let resp = self
            .envd(sid, Method::GET, "/files")
            .query(&[("path", path), ("username", "user")])
            .timeout(self.config.request_timeout)
            .send()
            .await
            .map_err(|e| self.transport_error("read file", &e))?;
        let status = resp.status();
        if status == StatusCode::NOT_FOUND {
            return Err(ProvisionerError::invalid(
                "path",
                format!("{path}: no such file"),
            ));
        }
        if !status.is_success() {
            let text = resp.text().await.unwrap_or_default();
            return Err(self.status_error("read file", "", status, &text));
        }
        let bytes = resp
            .bytes()
            .await
            .map_err(|e| self.transport_error("read file", &e))?;
        Ok(bytes.to_vec())
    }

    pub(super) async fn write_bytes(&self, sid: &str, path: &str, content: &[u8]) -> Result<()> {
        let boundary = format!("forkyard{}", uuid::Uuid::new_v4().simple());
        let name = path.rsplit('/').next().unwrap_or("file").replace('"', "");
        let mut body = Vec::with_capacity(content.len() + 256);
        body.extend_from_slice(
            format!(
                "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{name}\"\r\nContent-Type: application/octet-stream\r\n\r\n"
            )
            .as_bytes(),
        );
        body.extend_from_slice(content);
        body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
        let resp = self
            .envd(sid, Method::POST, "/files")
            .query(&[("path", path), ("username", "user")])
            .header(
                "Content-Type",
                format!("multipart/form-data; boundary={boundary}"),
            )
            .timeout(self.config.request_timeout)
            .body(body)
            .send()
            .await
            .map_err(|e| self.transport_error("write file", &e))?;
        let status = resp.status();
        if !status.is_success() {
            let text = resp.text().await.unwrap_or_default();
            return Err(self.status_error("write file", "", status, &text));
        }
        Ok(())
    }

    pub(super) fn path(&self, p: &str) -> Result<String> {
        if p.is_empty() || p.starts_with('/') || p.split('/').any(|c| c == "..") {
            return Err(ProvisionerError::invalid(
                "path",
                "must be relative to the workspace, without \"..\"",
            ));
        }
        Ok(format!("{WORKSPACE}/{p}"))
    }
}

/// Output capture up to [`OUTPUT_CAP`].
#[derive(Default)]
pub(super) struct Capture {
    pub(super) data: Vec<u8>,
    pub(super) truncated: bool,
}

impl Capture {
    pub(super) fn push(&mut self, b: &[u8]) {
        let room = OUTPUT_CAP.saturating_sub(self.data.len());
        if b.len() > room {
            self.truncated = true;
        }
        self.data.extend_from_slice(&b[..b.len().min(room)]);
    }
}
