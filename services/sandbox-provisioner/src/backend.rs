//! [`SandboxBackend`]: the session API every backend serves (local bubblewrap, E2B, and
//! later Kubernetes pods). A new backend is one more `impl SandboxBackend` and one
//! [`crate::Backends::with`] call; the router (`crate::router`) picks the backend of
//! each request.

use crate::error::{ProvisionerError, Result};
use async_trait::async_trait;
use forkyard_proto::sandbox::v1::{
    CollectPatchRequest, CollectPatchResponse, CreateSandboxRequest, DestroySandboxRequest,
    DestroySandboxResponse, ExecEvent, ExecRequest, ExecResponse, ForkSandboxRequest,
    ForkSandboxResponse, HealthCheckRequest, HealthCheckResponse, HydrateWorkspaceRequest,
    PersistWorkspaceRequest, PersistWorkspaceResponse, PtyEvent, ReadFileRequest, ReadFileResponse,
    ResizePtyRequest, ResizePtyResponse, Sandbox, StartPtyRequest, StartSandboxRequest,
    StopSandboxRequest, WriteFileRequest, WriteFileResponse, WritePtyRequest, WritePtyResponse,
};
use std::collections::HashMap;
use tokio::sync::mpsc;

/// One sandbox backend. Ids it hands out start with [`SandboxBackend::id_prefix`].
/// Operations a backend cannot offer keep the default body (FAILED_PRECONDITION).
#[async_trait]
pub trait SandboxBackend: Send + Sync + 'static {
    /// `CreateSandboxRequest.backend` value and activity-name prefix ("local", "e2b").
    fn name(&self) -> &'static str;
    /// Prefix of every sandbox id this backend hands out ("sbx-", "e2b-").
    fn id_prefix(&self) -> &'static str;
    /// Whether it can create sandboxes here (E2B: only with an API key). A disabled
    /// backend is not offered to runs (`ListBackends`).
    fn enabled(&self) -> bool {
        true
    }
    /// The isolation levels it can give a sandbox now, and those it has but cannot,
    /// each with the reason (`ListBackends`: the gateway refuses a run asking for one at
    /// launch). None by default: a backend whose sandboxes are its provider's own.
    async fn isolations(&self) -> (Vec<String>, HashMap<String, String>) {
        (Vec::new(), HashMap::new())
    }
    async fn create(&self, req: CreateSandboxRequest) -> Result<Sandbox>;
    async fn get(&self, id: &str) -> Result<Sandbox>;
    async fn list(&self, selector: &HashMap<String, String>) -> Result<Vec<Sandbox>>;
    async fn exec(&self, req: ExecRequest) -> Result<ExecResponse>;
    /// Output as it comes; the exit event last.
    async fn exec_stream(&self, req: ExecRequest) -> Result<mpsc::Receiver<ExecEvent>>;
    async fn health(&self, req: HealthCheckRequest) -> Result<HealthCheckResponse>;
    async fn collect_patch(&self, req: CollectPatchRequest) -> Result<CollectPatchResponse>;
    async fn read_file(&self, req: ReadFileRequest) -> Result<ReadFileResponse>;
    async fn write_file(&self, req: WriteFileRequest) -> Result<WriteFileResponse>;
    async fn destroy(&self, req: DestroySandboxRequest) -> Result<DestroySandboxResponse>;
    async fn stop(&self, req: StopSandboxRequest) -> Result<Sandbox> {
        Err(unsupported(self.name(), "stop", &req.sandbox_id))
    }
    async fn start(&self, req: StartSandboxRequest) -> Result<Sandbox> {
        Err(unsupported(self.name(), "start", &req.sandbox_id))
    }
    async fn persist(&self, req: PersistWorkspaceRequest) -> Result<PersistWorkspaceResponse> {
        Err(unsupported(
            self.name(),
            "persist_workspace",
            &req.sandbox_id,
        ))
    }
    async fn hydrate(&self, req: HydrateWorkspaceRequest) -> Result<Sandbox> {
        Err(unsupported(
            self.name(),
            "hydrate_workspace",
            &req.sandbox_id,
        ))
    }
    async fn fork(&self, req: ForkSandboxRequest) -> Result<ForkSandboxResponse> {
        Err(unsupported(self.name(), "fork", &req.sandbox_id))
    }
    /// A command on a pseudo-terminal: pty id first, output, exit last.
    async fn start_pty(&self, req: StartPtyRequest) -> Result<mpsc::Receiver<PtyEvent>> {
        Err(unsupported(self.name(), "start_pty", &req.sandbox_id))
    }
    async fn write_pty(&self, req: WritePtyRequest) -> Result<WritePtyResponse> {
        Err(unsupported(self.name(), "write_pty", &req.sandbox_id))
    }
    async fn resize_pty(&self, req: ResizePtyRequest) -> Result<ResizePtyResponse> {
        Err(unsupported(self.name(), "resize_pty", &req.sandbox_id))
    }
}

fn unsupported(backend: &str, op: &str, id: &str) -> ProvisionerError {
    ProvisionerError::FailedPrecondition(format!(
        "{op} is not supported by the {backend} backend (sandbox {id})"
    ))
}
