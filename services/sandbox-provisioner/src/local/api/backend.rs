//! The `local` backend behind [`SandboxBackend`]: each call goes to the [`Provisioner`].

use crate::{
    backend::SandboxBackend,
    error::Result,
    local::core::provisioner::{BACKEND, Provisioner},
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

/// Longest ListBackends waits for runsc's first probe.
const PROBE_WAIT: std::time::Duration = std::time::Duration::from_millis(1500);

/// The `local` backend: the bubblewrap [`Provisioner`].
#[derive(Clone)]
pub struct LocalBackend(pub Arc<Provisioner>);

#[async_trait]
impl SandboxBackend for LocalBackend {
    fn name(&self) -> &'static str {
        BACKEND
    }
    fn id_prefix(&self) -> &'static str {
        "sbx-"
    }
    /// Bubblewrap always; gVisor when a create asking for it would be taken (runsc
    /// probed once, as a create does). A first probe slower than [`PROBE_WAIT`] leaves
    /// gVisor unsaid this time: the gateway then leaves it to each create.
    async fn isolations(&self) -> (Vec<String>, HashMap<String, String>) {
        let mut offered = vec!["bubblewrap".to_owned()];
        let mut unavailable = HashMap::new();
        match tokio::time::timeout(PROBE_WAIT, self.0.check_isolation("gvisor")).await {
            Ok(Ok(())) => offered.push("gvisor".to_owned()),
            Ok(Err(e)) => {
                unavailable.insert("gvisor".to_owned(), e.to_string());
            }
            Err(_) => {}
        }
        (offered, unavailable)
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
