//! Backends behind one trait. [`SandboxBackend`] is the session API every backend
//! serves (local bubblewrap, E2B, and later Kubernetes pods); [`Backends`] routes a
//! request to one: `CreateSandboxRequest.backend` on create, the id's prefix
//! (`sbx-` local, `e2b-` E2B, …) afterwards. Callers (gRPC, activities) only see
//! [`Backends`], so a new backend is one more `impl SandboxBackend` and one
//! [`Backends::with`] call.

use crate::{
    error::{ProvisionerError, Result},
    local::provisioner::Provisioner,
};
use async_trait::async_trait;
use forkyard_proto::sandbox::v1::{
    CollectPatchRequest, CollectPatchResponse, CreateSandboxRequest, DestroySandboxRequest,
    DestroySandboxResponse, ExecEvent, ExecRequest, ExecResponse, ForkSandboxRequest,
    ForkSandboxResponse, HealthCheckRequest, HealthCheckResponse, HydrateWorkspaceRequest,
    PersistWorkspaceRequest, PersistWorkspaceResponse, PtyEvent, ReadFileRequest, ReadFileResponse,
    ResizePtyRequest, ResizePtyResponse, Sandbox, StartPtyRequest, StartSandboxRequest,
    StopSandboxRequest, WriteFileRequest, WriteFileResponse, WritePtyRequest, WritePtyResponse,
};
use std::{collections::HashMap, sync::Arc};
use tokio::sync::mpsc;

/// One sandbox backend. Ids it hands out start with [`SandboxBackend::id_prefix`].
/// Operations a backend cannot offer keep the default body (FAILED_PRECONDITION).
#[async_trait]
pub trait SandboxBackend: Send + Sync + 'static {
    /// `CreateSandboxRequest.backend` value and activity-name prefix ("local", "e2b").
    fn name(&self) -> &'static str;
    /// Prefix of every sandbox id this backend hands out ("sbx-", "e2b-").
    fn id_prefix(&self) -> &'static str;
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

/// The `local` backend: the bubblewrap [`Provisioner`].
#[derive(Clone)]
pub struct LocalBackend(pub Arc<Provisioner>);

#[async_trait]
impl SandboxBackend for LocalBackend {
    fn name(&self) -> &'static str {
        crate::local::provisioner::BACKEND
    }
    fn id_prefix(&self) -> &'static str {
        "sbx-"
    }
    async fn create(&self, req: CreateSandboxRequest) -> Result<Sandbox> {
        self.0.create(req).await
    }
    async fn get(&self, id: &str) -> Result<Sandbox> {
        self.0.get(id)
    }
    async fn list(&self, selector: &HashMap<String, String>) -> Result<Vec<Sandbox>> {
        Ok(self.0.list(selector))
    }
    async fn exec(&self, req: ExecRequest) -> Result<ExecResponse> {
        self.0.exec(req).await
    }
    async fn exec_stream(&self, req: ExecRequest) -> Result<mpsc::Receiver<ExecEvent>> {
        self.0.exec_stream(req).await
    }
    async fn health(&self, req: HealthCheckRequest) -> Result<HealthCheckResponse> {
        self.0.health(req).await
    }
    async fn collect_patch(&self, req: CollectPatchRequest) -> Result<CollectPatchResponse> {
        self.0.collect_patch(req).await
    }
    async fn read_file(&self, req: ReadFileRequest) -> Result<ReadFileResponse> {
        self.0.read_file(req).await
    }
    async fn write_file(&self, req: WriteFileRequest) -> Result<WriteFileResponse> {
        self.0.write_file(req).await
    }
    async fn destroy(&self, req: DestroySandboxRequest) -> Result<DestroySandboxResponse> {
        self.0.destroy(req).await
    }
    async fn stop(&self, req: StopSandboxRequest) -> Result<Sandbox> {
        self.0.stop(req).await
    }
    async fn start(&self, req: StartSandboxRequest) -> Result<Sandbox> {
        self.0.start(req).await
    }
    async fn persist(&self, req: PersistWorkspaceRequest) -> Result<PersistWorkspaceResponse> {
        self.0.persist(req).await
    }
    async fn hydrate(&self, req: HydrateWorkspaceRequest) -> Result<Sandbox> {
        self.0.hydrate(req).await
    }
    async fn fork(&self, req: ForkSandboxRequest) -> Result<ForkSandboxResponse> {
        self.0.fork(req).await
    }
    async fn start_pty(&self, req: StartPtyRequest) -> Result<mpsc::Receiver<PtyEvent>> {
        self.0.start_pty(req).await
    }
    async fn write_pty(&self, req: WritePtyRequest) -> Result<WritePtyResponse> {
        self.0.write_pty(req).await
    }
    async fn resize_pty(&self, req: ResizePtyRequest) -> Result<ResizePtyResponse> {
        self.0.resize_pty(req).await
    }
}

/// Every backend this replica serves; `local` is the default and the fallback for ids
/// no other backend claims.
#[derive(Clone)]
pub struct Backends {
    local: Arc<Provisioner>,
    all: Vec<Arc<dyn SandboxBackend>>,
}

impl Backends {
    /// `local` plus the backends the core was configured with (E2B).
    pub fn new(local: Arc<Provisioner>) -> Self {
        let mut all: Vec<Arc<dyn SandboxBackend>> = vec![Arc::new(LocalBackend(local.clone()))];
        all.push(local.e2b.clone());
        Self { local, all }
    }

    /// One more backend (e.g. Kubernetes); it must not reuse a name or id prefix.
    #[must_use]
    pub fn with(mut self, backend: Arc<dyn SandboxBackend>) -> Self {
        self.all.retain(|b| b.name() != backend.name());
        self.all.push(backend);
        self
    }

    pub fn local(&self) -> &Arc<Provisioner> {
        &self.local
    }

    /// The backend named `name` ("" = local).
    pub fn by_name(&self, name: &str) -> Result<&Arc<dyn SandboxBackend>> {
        let name = if name.is_empty() { "local" } else { name };
        self.all.iter().find(|b| b.name() == name).ok_or_else(|| {
            let known: Vec<&str> = self.all.iter().map(|b| b.name()).collect();
            ProvisionerError::invalid(
                "backend",
                format!("{name:?} is not served here (one of {known:?})"),
            )
        })
    }

    /// The backend that handed out `id`.
    pub fn for_id(&self, id: &str) -> &Arc<dyn SandboxBackend> {
        self.all
            .iter()
            .skip(1)
            .find(|b| id.starts_with(b.id_prefix()))
            .unwrap_or(&self.all[0])
    }

    pub async fn create(&self, req: CreateSandboxRequest) -> Result<Sandbox> {
        self.by_name(&req.backend)?.create(req).await
    }

    /// Sandboxes of every backend; a backend that is disabled contributes none.
    pub async fn list(&self, selector: &HashMap<String, String>) -> Result<Vec<Sandbox>> {
        let mut out = Vec::new();
        for b in &self.all {
            out.extend(b.list(selector).await?);
        }
        Ok(out)
    }
}
