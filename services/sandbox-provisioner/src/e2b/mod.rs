//! The `e2b` backend: a client for E2B's control-plane REST API (create / get / list /
//! kill / timeout / pause / resume, header `X-API-KEY`) and for envd, the daemon inside
//! each sandbox (Connect-RPC `process.Process/Start` for commands with streamed output,
//! `GET/POST /files` for files). Sandbox ids are `e2b-<E2B sandboxID>`.
//!
//! The API key comes only from `E2B_API_KEY`; [`ApiKey`] never prints it (Debug and
//! Display are redacted) and error bodies are scrubbed of it before they become errors.
//!
//! This file holds the backend itself (its `SandboxBackend` methods); by concern, the
//! rest: `config` (settings, the key), `api` (the control plane and its errors), `envd`
//! (commands and files in a sandbox), `repo` (the clone, the base commit), `pty`, `ttl`
//! (expiry), `templates` (images to templates) and `connect` (Connect-RPC framing).

mod api;
mod config;
pub mod connect;
mod envd;
mod pty;
mod repo;
pub mod templates;
mod ttl;

use crate::{
    backend::SandboxBackend,
    error::{ProvisionerError, Result},
    git,
    limits::{DEFAULT_PATCH_BYTES, MAX_PATCH_BYTES, OUTPUT_CAP},
};
use async_trait::async_trait;
use base64::engine::general_purpose::STANDARD as B64;
use forkyard_proto::sandbox::v1::{
    CollectPatchRequest, CollectPatchResponse, CreateSandboxRequest, DestroySandboxRequest,
    DestroySandboxResponse, ExecEvent, ExecRequest, ExecResponse, HealthCheckRequest,
    HealthCheckResponse, PtyEvent, ReadFileRequest, ReadFileResponse, ResizePtyRequest,
    ResizePtyResponse, Sandbox, StartPtyRequest, StartSandboxRequest, StopSandboxRequest,
    WriteFileRequest, WriteFileResponse, WritePtyRequest, WritePtyResponse, exec_event::Event,
};
use reqwest::{Method, StatusCode};
use serde_json::json;
use std::{collections::HashMap, sync::Arc};
use tokio::sync::mpsc;
use tracing::{info, warn};

use api::ApiSandbox;
pub use config::{ApiKey, E2bConfig};

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

    fn known(&self, sid: &str) -> Option<Known> {
        self.known.lock().expect("known lock").get(sid).cloned()
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
        let expires = crate::limits::now_ms()
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
        crate::metrics::created(self.name(), &created);
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
        let now = crate::limits::now_ms();
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
            crate::metrics::destroyed(0);
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
}

#[cfg(test)]
mod tests {
    use super::{ApiKey, E2bConfig, api::rfc3339_ms};

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
