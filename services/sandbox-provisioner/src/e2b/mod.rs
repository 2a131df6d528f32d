//! The `e2b` backend: a client for E2B's control-plane REST API (create / get / list /
//! kill / timeout / pause / resume, header `X-API-KEY`) and for envd, the daemon inside
//! each sandbox (Connect-RPC `process.Process/Start` for commands with streamed output,
//! `GET/POST /files` for files). Sandbox ids are `e2b-<E2B sandboxID>`.
//!
//! The API key comes only from `E2B_API_KEY`; [`ApiKey`] never prints it (Debug and
//! Display are redacted) and error bodies are scrubbed of it before they become errors.

pub mod connect;
mod pty;
pub mod templates;
mod ttl;

use crate::{
    backend::SandboxBackend,
    error::{ProvisionerError, Result},
    git,
    provisioner::{DEFAULT_PATCH_BYTES, MAX_PATCH_BYTES, OUTPUT_CAP, STATE_SELECTOR},
};
use async_trait::async_trait;
use base64::{Engine, engine::general_purpose::STANDARD as B64};
use forkyard_proto::sandbox::v1::{
    CollectPatchRequest, CollectPatchResponse, CreateSandboxRequest, DestroySandboxRequest,
    DestroySandboxResponse, ExecEvent, ExecRequest, ExecResponse, HealthCheckRequest,
    HealthCheckResponse, PtyEvent, ReadFileRequest, ReadFileResponse, ResizePtyRequest,
    ResizePtyResponse, Sandbox, SandboxState, StartPtyRequest, StartSandboxRequest,
    StopSandboxRequest, WriteFileRequest, WriteFileResponse, WritePtyRequest, WritePtyResponse,
    exec_event::Event,
};
use futures::StreamExt;
use reqwest::{Method, StatusCode};
use serde::Deserialize;
use serde_json::{Value, json};
use std::{
    collections::HashMap,
    sync::Arc,
    time::{Duration, Instant},
};
use tokio::sync::mpsc;
use tracing::{info, warn};

pub const BACKEND: &str = "e2b";
pub const ID_PREFIX: &str = "e2b-";
/// envd's port inside every sandbox.
pub const ENVD_PORT: u16 = 49983;
/// The default user's home; the workspace is a clone under it.
pub const HOME: &str = "/home/user";
pub const WORKSPACE: &str = "/home/user/workspace";
/// Where create records the base commit inside the sandbox.
const BASE_FILE: &str = "/home/user/.forkyard-base-commit";
/// Metadata key marking sandboxes this service created (list filters on it).
const MANAGED: &str = "forkyard.managed";
const BRANCH_KEY: &str = "forkyard.branch";
const KEY_KEY: &str = "forkyard.idempotency_key";
/// Metadata key holding our expiry (unix ms): E2B's own timeout is kept equal to it.
const EXPIRES_KEY: &str = "forkyard.expires_unix_ms";
/// The image a sandbox was created for (its template is the one mapped to it).
const IMAGE_KEY: &str = "forkyard.image";

/// The E2B API key. Debug/Display are redacted; only [`ApiKey::expose`] reveals it.
#[derive(Clone)]
pub struct ApiKey(String);

impl ApiKey {
    pub fn new(key: impl Into<String>) -> Self {
        Self(key.into())
    }
    fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ApiKey(***)")
    }
}

#[derive(Debug, Clone)]
pub struct E2bConfig {
    /// Control plane, default `https://api.e2b.dev`.
    pub api_url: String,
    /// Sandbox domain: envd is `https://49983-<sandboxID>.<domain>`. A value starting
    /// with `http://` or `https://` is a base URL instead: every envd call goes there
    /// with headers `E2b-Sandbox-Id` / `E2b-Sandbox-Port` (a proxy, or the test server).
    pub domain: String,
    /// Template sandboxes are created from.
    pub template: String,
    /// The template for each image a create may name (`templates`); others are refused.
    pub templates: templates::Templates,
    /// `None` = the backend is disabled.
    pub api_key: Option<ApiKey>,
    /// Limit for one control-plane or envd request (not for a command's run).
    pub request_timeout: Duration,
    /// Sandbox lifetime when the request gives no `ttl_secs`.
    pub default_timeout: Duration,
    /// Exec wall-clock limit when the request gives none.
    pub exec_timeout: Duration,
    /// Limit for cloning the repository inside the sandbox.
    pub clone_timeout: Duration,
    /// USD per second of a sandbox's life (E2B bills by the second).
    pub second_usd: f64,
}

impl Default for E2bConfig {
    fn default() -> Self {
        Self {
            api_url: "https://api.e2b.dev".into(),
            domain: "e2b.app".into(),
            template: "base".into(),
            templates: templates::Templates::default(),
            api_key: None,
            request_timeout: Duration::from_secs(30),
            default_timeout: Duration::from_secs(3600),
            exec_timeout: Duration::from_secs(600),
            clone_timeout: Duration::from_secs(300),
            second_usd: crate::usage::Prices::default().e2b_second_usd,
        }
    }
}

/// What create learned that E2B does not return later.
#[derive(Clone)]
struct Known {
    envd_token: Option<String>,
    domain: Option<String>,
    base_commit: String,
}

#[derive(Clone)]
pub struct E2bBackend {
    config: E2bConfig,
    http: reqwest::Client,
    owner_endpoint: String,
    owner_task_queue: String,
    /// Open pty commands: pty id → (E2B sandbox id, envd pid).
    ptys: Arc<std::sync::Mutex<HashMap<String, (String, u64)>>>,
    known: Arc<std::sync::Mutex<HashMap<String, Known>>>,
}

/// An E2B sandbox as the REST API describes it (create, get and list share fields).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ApiSandbox {
    #[serde(rename = "sandboxID")]
    sandbox_id: String,
    #[serde(default)]
    metadata: Option<HashMap<String, String>>,
    #[serde(default)]
    started_at: Option<String>,
    #[serde(default)]
    end_at: Option<String>,
    #[serde(default)]
    state: Option<String>,
    #[serde(default)]
    envd_access_token: Option<String>,
    #[serde(default)]
    domain: Option<String>,
}

impl E2bBackend {
    pub fn new(
        config: E2bConfig,
        owner_endpoint: String,
        owner_task_queue: String,
    ) -> Result<Arc<Self>, String> {
        let http = reqwest::Client::builder()
            .connect_timeout(config.request_timeout)
            .build()
            .map_err(|e| format!("E2B HTTP client: {e}"))?;
        Ok(Arc::new(Self {
            config,
            http,
            owner_endpoint,
            owner_task_queue,
            ptys: Arc::default(),
            known: Arc::default(),
        }))
    }

    pub fn enabled(&self) -> bool {
        self.config.api_key.is_some()
    }

    fn key(&self) -> Result<&ApiKey> {
        self.config.api_key.as_ref().ok_or_else(|| {
            ProvisionerError::FailedPrecondition(
                "the e2b backend is disabled: set E2B_API_KEY to enable it".into(),
            )
        })
    }

    /// Strip the key (and anything after 512 bytes) from text that came from a server.
    fn scrub(&self, text: &str) -> String {
        let mut s: String = text.chars().take(512).collect();
        if let Some(k) = &self.config.api_key
            && !k.expose().is_empty()
        {
            s = s.replace(k.expose(), "***");
        }
        s
    }

    fn e2b_id(id: &str) -> Result<&str> {
        id.strip_prefix(ID_PREFIX)
            .filter(|s| !s.is_empty())
            .ok_or_else(|| ProvisionerError::NotFound(id.to_owned()))
    }

    /// A failed HTTP exchange: 401/403 are auth failures (final), 404 not found, 429
    /// and 5xx and transport errors retryable, other 4xx final.
    fn status_error(
        &self,
        what: &str,
        id: &str,
        status: StatusCode,
        body: &str,
    ) -> ProvisionerError {
        let body = self.scrub(body);
        match status.as_u16() {
            401 | 403 => ProvisionerError::Auth(format!(
                "E2B rejected the API key (E2B_API_KEY) on {what}: {status}"
            )),
            404 => ProvisionerError::NotFound(if id.is_empty() {
                what.into()
            } else {
                id.into()
            }),
            429 | 500..=599 => {
                ProvisionerError::Unavailable(format!("E2B {what}: {status}: {body}"))
            }
            _ => ProvisionerError::FailedPrecondition(format!("E2B {what}: {status}: {body}")),
        }
    }

    fn transport_error(&self, what: &str, e: &reqwest::Error) -> ProvisionerError {
        let kind = if e.is_timeout() {
            "timed out"
        } else {
            "failed"
        };
        ProvisionerError::Unavailable(format!("E2B {what} {kind}: {}", self.scrub(&e.to_string())))
    }

    /// One control-plane call; `Ok(None)` for an empty body.
    async fn api(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, String)],
        body: Option<Value>,
        what: &str,
        id: &str,
    ) -> Result<Option<Value>> {
        let key = self.key()?;
        let url = format!("{}{path}", self.config.api_url.trim_end_matches('/'));
        let mut rb = self
            .http
            .request(method, url)
            .query(query)
            .header("X-API-KEY", key.expose())
            .timeout(self.config.request_timeout);
        if let Some(b) = body {
            rb = rb.json(&b);
        }
        let resp = rb
            .send()
            .await
            .map_err(|e| self.transport_error(what, &e))?;
        let status = resp.status();
        let text = resp
            .text()
            .await
            .map_err(|e| self.transport_error(what, &e))?;
        if !status.is_success() {
            return Err(self.status_error(what, id, status, &text));
        }
        if text.trim().is_empty() {
            return Ok(None);
        }
        serde_json::from_str(&text)
            .map(Some)
            .map_err(|e| ProvisionerError::Unavailable(format!("E2B {what}: bad JSON: {e}")))
    }

    fn known(&self, sid: &str) -> Option<Known> {
        self.known.lock().expect("known lock").get(sid).cloned()
    }

    /// An envd request for sandbox `sid` (its own host, or the base URL + routing headers).
    fn envd(&self, sid: &str, method: Method, path: &str) -> reqwest::RequestBuilder {
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

    fn to_proto(&self, s: &ApiSandbox) -> Sandbox {
        let mut labels = s.metadata.clone().unwrap_or_default();
        let branch = labels.remove(BRANCH_KEY).unwrap_or_default();
        labels.remove(MANAGED);
        labels.remove(KEY_KEY);
        let image = labels.remove(IMAGE_KEY).unwrap_or_default();
        // Ours when we set it (E2B's endAt of a paused sandbox says nothing about it).
        let expires = labels
            .remove(EXPIRES_KEY)
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| s.end_at.as_deref().map_or(0, rfc3339_ms));
        let state = match s.state.as_deref() {
            Some("paused") => SandboxState::Stopped,
            _ => SandboxState::Ready,
        };
        let created = s.started_at.as_deref().map_or(0, rfc3339_ms);
        Sandbox {
            id: format!("{ID_PREFIX}{}", s.sandbox_id),
            backend: BACKEND.into(),
            state: state.into(),
            labels,
            branch,
            base_commit: self
                .known(&s.sandbox_id)
                .map(|k| k.base_commit)
                .unwrap_or_default(),
            created_unix_ms: created,
            owner_endpoint: self.owner_endpoint.clone(),
            owner_task_queue: self.owner_task_queue.clone(),
            expires_unix_ms: expires,
            usage: Some(self.usage(created)),
            image,
            ..Default::default()
        }
    }

    /// What a sandbox created at `created_unix_ms` has cost so far: its wall time.
    fn usage(&self, created_unix_ms: i64) -> forkyard_proto::sandbox::v1::SandboxUsage {
        let wall_ms = if created_unix_ms > 0 {
            u64::try_from(crate::provisioner::now_ms() - created_unix_ms).unwrap_or(0)
        } else {
            0
        };
        let prices = crate::usage::Prices {
            e2b_second_usd: self.config.second_usd,
            ..Default::default()
        };
        forkyard_proto::sandbox::v1::SandboxUsage {
            wall_ms,
            cost_micros: prices.e2b(wall_ms),
            ..Default::default()
        }
    }

    /// Run argv in sandbox `sid`, streaming events to `tx`; returns the exit.
    async fn run(
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

    async fn kill_process(&self, sid: &str, pid: u64) {
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

    fn exec_params(&self, req: &ExecRequest) -> Result<(String, Duration)> {
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

    /// `git` in the workspace; a non-zero exit is an error naming `what`.
    async fn git(&self, sid: &str, args: &[&str], what: &str) -> Result<String> {
        let argv: Vec<String> = std::iter::once("git")
            .chain(args.iter().copied())
            .map(String::from)
            .collect();
        let env: HashMap<String, String> = git::sandbox_env().into_iter().collect();
        let r = self
            .run(sid, &argv, &env, WORKSPACE, self.config.exec_timeout, None)
            .await?;
        if r.exit_code != 0 || r.timed_out {
            return Err(ProvisionerError::FailedPrecondition(format!(
                "{what} in the sandbox exited {}: {}",
                r.exit_code,
                r.stderr.trim()
            )));
        }
        Ok(r.stdout)
    }

    async fn base_commit(&self, sid: &str) -> Result<String> {
        if let Some(k) = self.known(sid)
            && !k.base_commit.is_empty()
        {
            return Ok(k.base_commit);
        }
        let base = self
            .read_bytes(sid, BASE_FILE)
            .await
            .map(|b| String::from_utf8_lossy(&b).trim().to_owned())?;
        Ok(base)
    }

    async fn read_bytes(&self, sid: &str, path: &str) -> Result<Vec<u8>> {
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

    async fn write_bytes(&self, sid: &str, path: &str, content: &[u8]) -> Result<()> {
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

    async fn kill(&self, sid: &str) -> Result<bool> {
        match self
            .api(
                Method::DELETE,
                &format!("/sandboxes/{sid}"),
                &[],
                None,
                "kill sandbox",
                sid,
            )
            .await
        {
            Ok(_) => Ok(true),
            Err(ProvisionerError::NotFound(_)) => Ok(false),
            Err(e) => Err(e),
        }
    }

    async fn clone_repo(&self, sid: &str, req: &CreateSandboxRequest) -> Result<String> {
        let mut argv: Vec<String> = ["git", "clone", "--quiet"].map(String::from).to_vec();
        if !req.base_ref.is_empty() {
            argv.extend(["--branch".into(), req.base_ref.clone()]);
        }
        argv.extend(["--".into(), req.repo.clone(), WORKSPACE.into()]);
        let env: HashMap<String, String> = git::sandbox_env().into_iter().collect();
        let r = self
            .run(sid, &argv, &env, HOME, self.config.clone_timeout, None)
            .await?;
        if r.exit_code != 0 || r.timed_out {
            return Err(ProvisionerError::RepoUnavailable(format!(
                "git clone {} in the E2B sandbox {}: {}",
                req.repo,
                if r.timed_out { "timed out" } else { "failed" },
                r.stderr.trim()
            )));
        }
        if !req.branch.is_empty() {
            self.git(sid, &["checkout", "-q", "-b", &req.branch], "git checkout")
                .await?;
        }
        let base = self
            .git(sid, &["rev-parse", "HEAD"], "git rev-parse")
            .await?;
        let base = base.trim().to_owned();
        self.write_bytes(sid, BASE_FILE, base.as_bytes()).await?;
        Ok(base)
    }

    fn path(&self, p: &str) -> Result<String> {
        if p.is_empty() || p.starts_with('/') || p.split('/').any(|c| c == "..") {
            return Err(ProvisionerError::invalid(
                "path",
                "must be relative to the workspace, without \"..\"",
            ));
        }
        Ok(format!("{WORKSPACE}/{p}"))
    }
}

#[async_trait]
impl SandboxBackend for E2bBackend {
    fn name(&self) -> &'static str {
        BACKEND
    }
    fn id_prefix(&self) -> &'static str {
        ID_PREFIX
    }

    async fn create(&self, req: CreateSandboxRequest) -> Result<Sandbox> {
        self.key()?;
        if !req.egress_allow.is_empty() || !req.snapshot_id.is_empty() {
            return Err(ProvisionerError::invalid(
                if req.snapshot_id.is_empty() {
                    "egress_allow"
                } else {
                    "snapshot_id"
                },
                "not supported by the e2b backend",
            ));
        }
        // An image runs as the template the operator built from it; one not mapped is
        // refused rather than run on the default template without the tools asked for.
        let template = self.config.templates.for_image(&req.image)?;
        let template = template.unwrap_or(&self.config.template).to_owned();
        if req.repo.trim().is_empty() {
            return Err(ProvisionerError::invalid("repo", "must not be empty"));
        }
        git::check_branch(&req.branch).await?;
        if !req.idempotency_key.is_empty() {
            let mut sel = HashMap::new();
            sel.insert(KEY_KEY.to_owned(), req.idempotency_key.clone());
            if let Some(s) = self.list_api(&sel).await?.into_iter().next() {
                info!(sandbox_id = %s.id, "create repeated with the same idempotency key");
                return Ok(s);
            }
        }
        let mut metadata = req.labels.clone();
        metadata.insert(MANAGED.into(), "true".into());
        metadata.insert(BRANCH_KEY.into(), req.branch.clone());
        if !req.idempotency_key.is_empty() {
            metadata.insert(KEY_KEY.into(), req.idempotency_key.clone());
        }
        if !req.image.is_empty() {
            metadata.insert(IMAGE_KEY.into(), req.image.clone());
        }
        let timeout = match req.ttl_secs {
            0 => self.config.default_timeout.as_secs(),
            s => u64::from(s),
        };
        let expires = crate::provisioner::now_ms()
            .saturating_add(i64::try_from(timeout.saturating_mul(1000)).unwrap_or(i64::MAX));
        metadata.insert(EXPIRES_KEY.into(), expires.to_string());
        let body = json!({
            "templateID": template,
            "timeout": timeout,
            "metadata": metadata,
        });
        let created = self
            .api(
                Method::POST,
                "/sandboxes",
                &[],
                Some(body),
                "create sandbox",
                "",
            )
            .await;
        crate::lifecycle::created(self.name(), &created);
        let created = created?
            .ok_or_else(|| ProvisionerError::Unavailable("E2B create: empty response".into()))?;
        let api: ApiSandbox = serde_json::from_value(created)
            .map_err(|e| ProvisionerError::Unavailable(format!("E2B create: {e}")))?;
        let sid = api.sandbox_id.clone();
        self.known.lock().expect("known lock").insert(
            sid.clone(),
            Known {
                envd_token: api.envd_access_token.clone(),
                domain: api.domain.clone(),
                base_commit: String::new(),
            },
        );
        info!(sandbox_id = %format!("{ID_PREFIX}{sid}"), template = %template, "e2b sandbox created");
        let base = match self.clone_repo(&sid, &req).await {
            Ok(b) => b,
            Err(e) => {
                warn!(sandbox_id = %sid, error = %e, "e2b create failed; killing the sandbox");
                let _ = self.kill(&sid).await;
                self.known.lock().expect("known lock").remove(&sid);
                return Err(e);
            }
        };
        if let Some(k) = self.known.lock().expect("known lock").get_mut(&sid) {
            k.base_commit.clone_from(&base);
        }
        // E2B's clock started at its create; the clone took a while. Set its timeout
        // again so that E2B ends the sandbox when ours says, not later.
        if let Err(e) = self.set_timeout(&sid, expires).await {
            warn!(sandbox_id = %sid, error = %e, "cannot align the e2b timeout with the ttl");
        }
        let now = crate::provisioner::now_ms();
        let mut s = self.to_proto(&ApiSandbox {
            metadata: Some(metadata),
            ..api
        });
        s.base_commit = base;
        s.created_unix_ms = now;
        Ok(s)
    }

    async fn get(&self, id: &str) -> Result<Sandbox> {
        let sid = Self::e2b_id(id)?;
        let v = self
            .api(
                Method::GET,
                &format!("/sandboxes/{sid}"),
                &[],
                None,
                "get sandbox",
                id,
            )
            .await?
            .ok_or_else(|| ProvisionerError::Unavailable("E2B get: empty response".into()))?;
        let api: ApiSandbox = serde_json::from_value(v)
            .map_err(|e| ProvisionerError::Unavailable(format!("E2B get: {e}")))?;
        let mut s = self.to_proto(&api);
        if s.base_commit.is_empty() {
            s.base_commit = self.base_commit(sid).await.unwrap_or_default();
        }
        Ok(s)
    }

    /// Sandboxes this service created; empty when the backend is disabled.
    async fn list(&self, selector: &HashMap<String, String>) -> Result<Vec<Sandbox>> {
        if !self.enabled() {
            return Ok(Vec::new());
        }
        self.list_api(selector).await
    }

    async fn exec(&self, req: ExecRequest) -> Result<ExecResponse> {
        let (sid, timeout) = self.exec_params(&req)?;
        self.run(&sid, &req.argv, &req.env, WORKSPACE, timeout, None)
            .await
    }

    async fn exec_stream(&self, req: ExecRequest) -> Result<mpsc::Receiver<ExecEvent>> {
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

    async fn health(&self, req: HealthCheckRequest) -> Result<HealthCheckResponse> {
        let sid = Self::e2b_id(&req.sandbox_id)?;
        let resp = self
            .envd(sid, Method::GET, "/health")
            .timeout(self.config.request_timeout)
            .send()
            .await;
        let (healthy, detail) = match resp {
            Ok(r) if r.status().is_success() => {
                match self
                    .git(sid, &["rev-parse", "--git-dir"], "git rev-parse")
                    .await
                {
                    Ok(_) => (
                        true,
                        "envd healthy, workspace is a git repository".to_owned(),
                    ),
                    Err(e) => (false, e.to_string()),
                }
            }
            Ok(r) if r.status() == StatusCode::NOT_FOUND => {
                return Err(ProvisionerError::NotFound(req.sandbox_id.clone()));
            }
            Ok(r) => (false, format!("envd health: {}", r.status())),
            Err(e) => (false, self.transport_error("envd health", &e).to_string()),
        };
        Ok(HealthCheckResponse { healthy, detail })
    }

    async fn collect_patch(&self, req: CollectPatchRequest) -> Result<CollectPatchResponse> {
        let sid = Self::e2b_id(&req.sandbox_id)?;
        let base = self.base_commit(sid).await?;
        let max = match req.max_bytes {
            0 => DEFAULT_PATCH_BYTES,
            n => n.min(MAX_PATCH_BYTES),
        };
        let diff = [
            "diff",
            "--cached",
            "--no-color",
            "--no-ext-diff",
            "--no-textconv",
        ];
        self.git(sid, &["add", "-A"], "git add").await?;
        let args: Vec<&str> = diff
            .iter()
            .copied()
            .chain(["--binary", &base, "--"])
            .collect();
        let patch = self.git(sid, &args, "git diff").await?;
        let args: Vec<&str> = diff
            .iter()
            .copied()
            .chain(["--numstat", &base, "--"])
            .collect();
        let numstat = self.git(sid, &args, "git diff --numstat").await?;
        let total = patch.len() as u64;
        let mut patch = patch;
        let truncated = total > max;
        if truncated {
            let mut cut = usize::try_from(max).unwrap_or(usize::MAX);
            while !patch.is_char_boundary(cut) {
                cut -= 1;
            }
            patch.truncate(cut);
        }
        Ok(CollectPatchResponse {
            patch,
            truncated,
            patch_bytes: total,
            diffstat: Some(git::parse_numstat(&numstat)),
            base_commit: base,
            usage: self.get(&req.sandbox_id).await.ok().and_then(|s| s.usage),
            // E2B's sandbox has a disk of its own size: nothing grows past a limit here.
            skipped_files: Vec::new(),
        })
    }

    async fn read_file(&self, req: ReadFileRequest) -> Result<ReadFileResponse> {
        let sid = Self::e2b_id(&req.sandbox_id)?;
        let path = self.path(&req.path)?;
        let mut content = self.read_bytes(sid, &path).await?;
        let size = content.len() as u64;
        let max = match req.max_bytes {
            0 => OUTPUT_CAP as u64,
            n => n,
        };
        let truncated = size > max;
        content.truncate(usize::try_from(max).unwrap_or(usize::MAX));
        Ok(ReadFileResponse {
            content,
            truncated,
            size,
        })
    }

    async fn write_file(&self, req: WriteFileRequest) -> Result<WriteFileResponse> {
        let sid = Self::e2b_id(&req.sandbox_id)?;
        let path = self.path(&req.path)?;
        self.write_bytes(sid, &path, &req.content).await?;
        if req.mode != 0 {
            let argv = vec!["chmod".into(), format!("{:o}", req.mode & 0o7777), path];
            let r = self
                .run(
                    sid,
                    &argv,
                    &HashMap::new(),
                    WORKSPACE,
                    self.config.request_timeout,
                    None,
                )
                .await?;
            if r.exit_code != 0 {
                return Err(ProvisionerError::FailedPrecondition(format!(
                    "chmod in the sandbox: {}",
                    r.stderr.trim()
                )));
            }
        }
        Ok(WriteFileResponse {
            bytes_written: req.content.len() as u64,
        })
    }

    async fn destroy(&self, req: DestroySandboxRequest) -> Result<DestroySandboxResponse> {
        let sid = Self::e2b_id(&req.sandbox_id)?;
        let existed = self.kill(sid).await?;
        if existed {
            // The E2B API gives no creation time on kill: the lifetime is not observed.
            crate::lifecycle::destroyed(0);
        }
        self.known.lock().expect("known lock").remove(sid);
        info!(sandbox_id = %req.sandbox_id, existed, reason = %req.reason, "e2b sandbox destroyed");
        Ok(DestroySandboxResponse { existed })
    }

    async fn stop(&self, req: StopSandboxRequest) -> Result<Sandbox> {
        let sid = Self::e2b_id(&req.sandbox_id)?;
        let path = format!("/sandboxes/{sid}/pause");
        self.api(
            Method::POST,
            &path,
            &[],
            None,
            "pause sandbox",
            &req.sandbox_id,
        )
        .await?;
        self.get(&req.sandbox_id).await
    }

    async fn start(&self, req: StartSandboxRequest) -> Result<Sandbox> {
        let sid = Self::e2b_id(&req.sandbox_id)?;
        let timeout = self.resume_timeout(&req.sandbox_id).await?;
        let path = format!("/sandboxes/{sid}/resume");
        let body = json!({"timeout": timeout});
        self.api(
            Method::POST,
            &path,
            &[],
            Some(body),
            "resume sandbox",
            &req.sandbox_id,
        )
        .await?;
        self.get(&req.sandbox_id).await
    }

    async fn start_pty(&self, req: StartPtyRequest) -> Result<mpsc::Receiver<PtyEvent>> {
        self.pty_start(req).await
    }
    async fn write_pty(&self, req: WritePtyRequest) -> Result<WritePtyResponse> {
        self.pty_write(req).await
    }
    async fn resize_pty(&self, req: ResizePtyRequest) -> Result<ResizePtyResponse> {
        self.pty_resize(req).await
    }
}

impl E2bBackend {
    /// A handle sharing this backend's client and state, for spawned tasks.
    fn self_arc(&self) -> Arc<Self> {
        Arc::new(self.clone())
    }

    /// E2B's list, narrowed to our sandboxes and `selector` (labels; `forkyard.state`).
    async fn list_api(&self, selector: &HashMap<String, String>) -> Result<Vec<Sandbox>> {
        let query = [("metadata", format!("{MANAGED}=true"))];
        let v = self
            .api(
                Method::GET,
                "/sandboxes",
                &query,
                None,
                "list sandboxes",
                "",
            )
            .await?
            .unwrap_or(Value::Array(Vec::new()));
        let all: Vec<ApiSandbox> = serde_json::from_value(v)
            .map_err(|e| ProvisionerError::Unavailable(format!("E2B list: {e}")))?;
        let states: Vec<String> = selector
            .get(STATE_SELECTOR)
            .map(|v| {
                v.split(',')
                    .map(|s| s.trim().to_ascii_lowercase())
                    .collect()
            })
            .unwrap_or_default();
        let mut out: Vec<Sandbox> = all
            .iter()
            .filter(|a| {
                let md = a.metadata.clone().unwrap_or_default();
                md.get(MANAGED).is_some_and(|v| v == "true")
                    && selector
                        .iter()
                        .all(|(k, v)| k == STATE_SELECTOR || md.get(k) == Some(v))
            })
            .map(|a| self.to_proto(a))
            .filter(|s| {
                let name = if s.state == SandboxState::Stopped as i32 {
                    "stopped"
                } else {
                    "ready"
                };
                states.is_empty() || states.iter().any(|st| st == name)
            })
            .collect();
        out.sort_by(|a, b| (a.created_unix_ms, &a.id).cmp(&(b.created_unix_ms, &b.id)));
        Ok(out)
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

/// Milliseconds since the epoch of an RFC 3339 UTC timestamp (0 if unparsable).
fn rfc3339_ms(s: &str) -> i64 {
    fn num(s: &str) -> Option<i64> {
        s.parse().ok()
    }
    let parse = || -> Option<i64> {
        let (date, time) = s.split_once('T')?;
        let mut d = date.split('-');
        let (y, m, day) = (num(d.next()?)?, num(d.next()?)?, num(d.next()?)?);
        let t = time.trim_end_matches('Z');
        let t = t.split(['+']).next()?;
        let mut parts = t.split(':');
        let (hh, mm) = (num(parts.next()?)?, num(parts.next()?)?);
        let sec: f64 = parts.next()?.parse().ok()?;
        // days from civil (Howard Hinnant)
        let y = if m <= 2 { y - 1 } else { y };
        let era = y.div_euclid(400);
        let yoe = y - era * 400;
        let mp = (m + 9) % 12;
        let doy = (153 * mp + 2) / 5 + day - 1;
        let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
        let days = era * 146_097 + doe - 719_468;
        #[allow(clippy::cast_possible_truncation)]
        let ms = (sec * 1000.0) as i64;
        Some(((days * 24 + hh) * 60 + mm) * 60_000 + ms)
    };
    parse().unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_is_redacted_and_timestamps_parse() {
        let c = E2bConfig {
            api_key: Some(ApiKey::new("e2b_secret_123")),
            ..E2bConfig::default()
        };
        assert!(!format!("{c:?}").contains("e2b_secret_123"));
        assert_eq!(rfc3339_ms("1970-01-01T00:00:01Z"), 1000);
        assert_eq!(rfc3339_ms("2024-01-01T00:00:00.5Z"), 1_704_067_200_500);
    }
}
