//! The gRPC front door: `forkyard.sandbox.v1.SandboxProvisioner` over [`Backends`]:
//! create picks the backend from `CreateSandboxRequest.backend`, every other call from
//! the sandbox id. Dropping an `Exec` call drops its future, which kills the process.

use crate::{local::core::provisioner::Provisioner, router::Backends};
use forkyard_proto::sandbox::v1::{
    CollectPatchRequest, CollectPatchResponse, CreateSandboxRequest, DeleteSnapshotRequest,
    DeleteSnapshotResponse, DestroySandboxRequest, DestroySandboxResponse, ExecEvent, ExecRequest,
    ExecResponse, ForkSandboxRequest, ForkSandboxResponse, GetSandboxRequest, HealthCheckRequest,
    HealthCheckResponse, HydrateWorkspaceRequest, ListBackendsRequest, ListBackendsResponse,
    ListSandboxesRequest, ListSandboxesResponse, ListSnapshotsRequest, ListSnapshotsResponse,
    PersistWorkspaceRequest, PersistWorkspaceResponse, PtyEvent, ReadFileRequest, ReadFileResponse,
    ResizePtyRequest, ResizePtyResponse, Sandbox, StartPtyRequest, StartSandboxRequest,
    StopSandboxRequest, WriteFileRequest, WriteFileResponse, WritePtyRequest, WritePtyResponse,
    sandbox_provisioner_server::{SandboxProvisioner, SandboxProvisionerServer},
};
use futures::StreamExt;
use std::{pin::Pin, sync::Arc};
use tonic::{Request, Response, Status};

#[derive(Clone)]
pub struct SandboxService {
    core: Backends,
}

impl SandboxService {
    /// `local`, and `e2b` disabled ([`Backends::new`]).
    pub fn new(core: Arc<Provisioner>) -> Self {
        Self::with_backends(Backends::new(core))
    }

    pub fn with_backends(core: Backends) -> Self {
        Self { core }
    }

    /// The tonic server for this service.
    pub fn into_server(self) -> SandboxProvisionerServer<Self> {
        SandboxProvisionerServer::new(self)
    }
}

#[tonic::async_trait]
impl SandboxProvisioner for SandboxService {
    async fn create_sandbox(
        &self,
        req: Request<CreateSandboxRequest>,
    ) -> Result<Response<Sandbox>, Status> {
        Ok(Response::new(self.core.create(req.into_inner()).await?))
    }

    async fn get_sandbox(
        &self,
        req: Request<GetSandboxRequest>,
    ) -> Result<Response<Sandbox>, Status> {
        let id = req.into_inner().sandbox_id;
        Ok(Response::new(self.core.for_id(&id).get(&id).await?))
    }

    async fn list_backends(
        &self,
        _req: Request<ListBackendsRequest>,
    ) -> Result<Response<ListBackendsResponse>, Status> {
        Ok(Response::new(ListBackendsResponse {
            backends: self.core.offered(),
            offers: self.core.offers().await,
        }))
    }

    async fn list_sandboxes(
        &self,
        req: Request<ListSandboxesRequest>,
    ) -> Result<Response<ListSandboxesResponse>, Status> {
        let sandboxes = self.core.list(&req.into_inner().label_selector).await?;
        Ok(Response::new(ListSandboxesResponse { sandboxes }))
    }

    async fn exec(&self, req: Request<ExecRequest>) -> Result<Response<ExecResponse>, Status> {
        Ok(Response::new({
            let r = req.into_inner();
            self.core.for_id(&r.sandbox_id).exec(r).await?
        }))
    }

    async fn health_check(
        &self,
        req: Request<HealthCheckRequest>,
    ) -> Result<Response<HealthCheckResponse>, Status> {
        Ok(Response::new({
            let r = req.into_inner();
            self.core.for_id(&r.sandbox_id).health(r).await?
        }))
    }

    async fn collect_patch(
        &self,
        req: Request<CollectPatchRequest>,
    ) -> Result<Response<CollectPatchResponse>, Status> {
        Ok(Response::new({
            let r = req.into_inner();
            self.core.collect_patch(r).await?
        }))
    }

    async fn destroy_sandbox(
        &self,
        req: Request<DestroySandboxRequest>,
    ) -> Result<Response<DestroySandboxResponse>, Status> {
        Ok(Response::new({
            let r = req.into_inner();
            self.core.for_id(&r.sandbox_id).destroy(r).await?
        }))
    }

    type ExecStreamStream =
        Pin<Box<dyn futures::Stream<Item = Result<ExecEvent, Status>> + Send + 'static>>;

    async fn exec_stream(
        &self,
        req: Request<ExecRequest>,
    ) -> Result<Response<Self::ExecStreamStream>, Status> {
        let rx = {
            let r = req.into_inner();
            self.core.for_id(&r.sandbox_id).exec_stream(r).await?
        };
        let stream = tokio_stream::wrappers::ReceiverStream::new(rx).map(Ok);
        Ok(Response::new(Box::pin(stream)))
    }

    async fn read_file(
        &self,
        req: Request<ReadFileRequest>,
    ) -> Result<Response<ReadFileResponse>, Status> {
        Ok(Response::new({
            let r = req.into_inner();
            self.core.for_id(&r.sandbox_id).read_file(r).await?
        }))
    }

    async fn write_file(
        &self,
        req: Request<WriteFileRequest>,
    ) -> Result<Response<WriteFileResponse>, Status> {
        Ok(Response::new({
            let r = req.into_inner();
            self.core.for_id(&r.sandbox_id).write_file(r).await?
        }))
    }

    async fn stop_sandbox(
        &self,
        req: Request<StopSandboxRequest>,
    ) -> Result<Response<Sandbox>, Status> {
        Ok(Response::new({
            let r = req.into_inner();
            self.core.for_id(&r.sandbox_id).stop(r).await?
        }))
    }

    async fn start_sandbox(
        &self,
        req: Request<StartSandboxRequest>,
    ) -> Result<Response<Sandbox>, Status> {
        Ok(Response::new({
            let r = req.into_inner();
            self.core.for_id(&r.sandbox_id).start(r).await?
        }))
    }

    async fn persist_workspace(
        &self,
        req: Request<PersistWorkspaceRequest>,
    ) -> Result<Response<PersistWorkspaceResponse>, Status> {
        Ok(Response::new({
            let r = req.into_inner();
            self.core.for_id(&r.sandbox_id).persist(r).await?
        }))
    }

    async fn hydrate_workspace(
        &self,
        req: Request<HydrateWorkspaceRequest>,
    ) -> Result<Response<Sandbox>, Status> {
        Ok(Response::new({
            let r = req.into_inner();
            self.core.for_id(&r.sandbox_id).hydrate(r).await?
        }))
    }

    async fn fork_sandbox(
        &self,
        req: Request<ForkSandboxRequest>,
    ) -> Result<Response<ForkSandboxResponse>, Status> {
        Ok(Response::new({
            let r = req.into_inner();
            self.core.for_id(&r.sandbox_id.clone()).fork(r).await?
        }))
    }

    async fn delete_snapshot(
        &self,
        req: Request<DeleteSnapshotRequest>,
    ) -> Result<Response<DeleteSnapshotResponse>, Status> {
        // Snapshots are the local backend's (its snapshot store on this host).
        Ok(Response::new(
            self.core.local().delete_snapshot(req.into_inner()).await?,
        ))
    }

    async fn list_snapshots(
        &self,
        req: Request<ListSnapshotsRequest>,
    ) -> Result<Response<ListSnapshotsResponse>, Status> {
        Ok(Response::new(
            self.core.local().list_snapshots(req.into_inner()).await?,
        ))
    }

    type StartPtyStream =
        Pin<Box<dyn futures::Stream<Item = Result<PtyEvent, Status>> + Send + 'static>>;

    async fn start_pty(
        &self,
        req: Request<StartPtyRequest>,
    ) -> Result<Response<Self::StartPtyStream>, Status> {
        let r = req.into_inner();
        let rx = self.core.for_id(&r.sandbox_id).start_pty(r).await?;
        let stream = tokio_stream::wrappers::ReceiverStream::new(rx).map(Ok);
        Ok(Response::new(Box::pin(stream)))
    }

    async fn write_pty(
        &self,
        req: Request<WritePtyRequest>,
    ) -> Result<Response<WritePtyResponse>, Status> {
        let r = req.into_inner();
        Ok(Response::new(
            self.core.for_id(&r.sandbox_id).write_pty(r).await?,
        ))
    }

    async fn resize_pty(
        &self,
        req: Request<ResizePtyRequest>,
    ) -> Result<Response<ResizePtyResponse>, Status> {
        let r = req.into_inner();
        Ok(Response::new(
            self.core.for_id(&r.sandbox_id).resize_pty(r).await?,
        ))
    }
}
