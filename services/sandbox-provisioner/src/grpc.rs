//! The gRPC front door: `forkyard.sandbox.v1.SandboxProvisioner` over [`Provisioner`].
//! Dropping an `Exec` call drops its future, which kills the sandboxed process.

use crate::provisioner::Provisioner;
use forkyard_proto::sandbox::v1::{
    CollectPatchRequest, CollectPatchResponse, CreateSandboxRequest, DestroySandboxRequest,
    DestroySandboxResponse, ExecEvent, ExecRequest, ExecResponse, ForkSandboxRequest,
    ForkSandboxResponse, GetSandboxRequest, HealthCheckRequest, HealthCheckResponse,
    HydrateWorkspaceRequest, ListSandboxesRequest, ListSandboxesResponse, PersistWorkspaceRequest,
    PersistWorkspaceResponse, ReadFileRequest, ReadFileResponse, Sandbox, StartSandboxRequest,
    StopSandboxRequest, WriteFileRequest, WriteFileResponse,
    sandbox_provisioner_server::{SandboxProvisioner, SandboxProvisionerServer},
};
use futures::StreamExt;
use std::{pin::Pin, sync::Arc};
use tonic::{Request, Response, Status};

#[derive(Clone)]
pub struct SandboxService {
    core: Arc<Provisioner>,
}

impl SandboxService {
    pub fn new(core: Arc<Provisioner>) -> Self {
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
        Ok(Response::new(self.core.get(&req.into_inner().sandbox_id)?))
    }

    async fn list_sandboxes(
        &self,
        req: Request<ListSandboxesRequest>,
    ) -> Result<Response<ListSandboxesResponse>, Status> {
        let sandboxes = self.core.list(&req.into_inner().label_selector);
        Ok(Response::new(ListSandboxesResponse { sandboxes }))
    }

    async fn exec(&self, req: Request<ExecRequest>) -> Result<Response<ExecResponse>, Status> {
        Ok(Response::new(self.core.exec(req.into_inner()).await?))
    }

    async fn health_check(
        &self,
        req: Request<HealthCheckRequest>,
    ) -> Result<Response<HealthCheckResponse>, Status> {
        Ok(Response::new(self.core.health(req.into_inner()).await?))
    }

    async fn collect_patch(
        &self,
        req: Request<CollectPatchRequest>,
    ) -> Result<Response<CollectPatchResponse>, Status> {
        Ok(Response::new(
            self.core.collect_patch(req.into_inner()).await?,
        ))
    }

    async fn destroy_sandbox(
        &self,
        req: Request<DestroySandboxRequest>,
    ) -> Result<Response<DestroySandboxResponse>, Status> {
        Ok(Response::new(self.core.destroy(req.into_inner()).await?))
    }

    type ExecStreamStream =
        Pin<Box<dyn futures::Stream<Item = Result<ExecEvent, Status>> + Send + 'static>>;

    async fn exec_stream(
        &self,
        req: Request<ExecRequest>,
    ) -> Result<Response<Self::ExecStreamStream>, Status> {
        let rx = self.core.exec_stream(req.into_inner()).await?;
        let stream = tokio_stream::wrappers::ReceiverStream::new(rx).map(Ok);
        Ok(Response::new(Box::pin(stream)))
    }

    async fn read_file(
        &self,
        req: Request<ReadFileRequest>,
    ) -> Result<Response<ReadFileResponse>, Status> {
        Ok(Response::new(self.core.read_file(req.into_inner()).await?))
    }

    async fn write_file(
        &self,
        req: Request<WriteFileRequest>,
    ) -> Result<Response<WriteFileResponse>, Status> {
        Ok(Response::new(self.core.write_file(req.into_inner()).await?))
    }

    async fn stop_sandbox(
        &self,
        req: Request<StopSandboxRequest>,
    ) -> Result<Response<Sandbox>, Status> {
        Ok(Response::new(self.core.stop(req.into_inner()).await?))
    }

    async fn start_sandbox(
        &self,
        req: Request<StartSandboxRequest>,
    ) -> Result<Response<Sandbox>, Status> {
        Ok(Response::new(self.core.start(req.into_inner()).await?))
    }

    async fn persist_workspace(
        &self,
        req: Request<PersistWorkspaceRequest>,
    ) -> Result<Response<PersistWorkspaceResponse>, Status> {
        Ok(Response::new(self.core.persist(req.into_inner()).await?))
    }

    async fn hydrate_workspace(
        &self,
        req: Request<HydrateWorkspaceRequest>,
    ) -> Result<Response<Sandbox>, Status> {
        Ok(Response::new(self.core.hydrate(req.into_inner()).await?))
    }

    async fn fork_sandbox(
        &self,
        req: Request<ForkSandboxRequest>,
    ) -> Result<Response<ForkSandboxResponse>, Status> {
        Ok(Response::new(self.core.fork(req.into_inner()).await?))
    }
}
