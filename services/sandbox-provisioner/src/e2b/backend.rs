//! The e2b backend behind [`SandboxBackend`]: the small calls here, each larger one in
//! the file of its concern (`create`, `envd`, `files`, `repo`, `pty`).

use super::{BACKEND, E2bBackend, ID_PREFIX, api::ApiSandbox};
use crate::{
    backend::SandboxBackend,
    error::{ProvisionerError, Result},
};
use async_trait::async_trait;
use forkyard_proto::sandbox::v1::{
    CollectPatchRequest, CollectPatchResponse, CreateSandboxRequest, DestroySandboxRequest,
    DestroySandboxResponse, ExecEvent, ExecRequest, ExecResponse, HealthCheckRequest,
    HealthCheckResponse, PtyEvent, ReadFileRequest, ReadFileResponse, ResizePtyRequest,
    ResizePtyResponse, Sandbox, StartPtyRequest, StartSandboxRequest, StopSandboxRequest,
    WriteFileRequest, WriteFileResponse, WritePtyRequest, WritePtyResponse,
};
use reqwest::{Method, StatusCode};
use serde_json::json;
use std::collections::HashMap;
use tokio::sync::mpsc;
use tracing::info;

#[async_trait]
impl SandboxBackend for E2bBackend {
    fn name(&self) -> &'static str {
        BACKEND
    }
    fn id_prefix(&self) -> &'static str {
        ID_PREFIX
    }
    fn enabled(&self) -> bool {
        E2bBackend::enabled(self)
    }

    async fn create(&self, req: CreateSandboxRequest) -> Result<Sandbox> {
        self.create_sandbox(req).await
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
        self.exec_captured(req).await
    }

    async fn exec_stream(&self, req: ExecRequest) -> Result<mpsc::Receiver<ExecEvent>> {
        self.exec_streamed(req)
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
        self.patch(req).await
    }

    async fn read_file(&self, req: ReadFileRequest) -> Result<ReadFileResponse> {
        self.read_file_at(req).await
    }

    async fn write_file(&self, req: WriteFileRequest) -> Result<WriteFileResponse> {
        self.write_file_at(req).await
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
