//! The `forkyard.janitor.v1.Janitor` gRPC service.

use crate::{sandboxes::Sandboxes, sweeper::Sweeper, workflows::Workflows};
use forkyard_proto::janitor::v1::{
    SweepReport, SweepRequest,
    janitor_server::{Janitor, JanitorServer},
};
use std::sync::Arc;
use tonic::{Request, Response, Status};

pub struct JanitorService<S, W> {
    sweeper: Arc<Sweeper<S, W>>,
}

impl<S, W> JanitorService<S, W> {
    pub fn new(sweeper: Arc<Sweeper<S, W>>) -> Self {
        Self { sweeper }
    }
}

impl<S: Sandboxes, W: Workflows> JanitorService<S, W> {
    pub fn into_server(self) -> JanitorServer<Self> {
        JanitorServer::new(self)
    }
}

#[tonic::async_trait]
impl<S: Sandboxes, W: Workflows> Janitor for JanitorService<S, W> {
    async fn sweep_now(&self, req: Request<SweepRequest>) -> Result<Response<SweepReport>, Status> {
        Ok(Response::new(self.sweeper.sweep(req.get_ref()).await?))
    }
}
