//! The Temporal front door: `local.*` activities on queue `sandbox-provisioner`, over the
//! same [`Provisioner`] as the gRPC service.

use crate::{local::core::provisioner::Provisioner, router::Backends};
use forkyard_proto::{
    activities::markers,
    sandbox::v1::{
        CollectPatchRequest, CollectPatchResponse, CreateSandboxRequest, DestroySandboxRequest,
        DestroySandboxResponse, ExecRequest, ExecResponse, ForkSandboxRequest, ForkSandboxResponse,
        GetSandboxRequest, HealthCheckRequest, HealthCheckResponse, HydrateWorkspaceRequest,
        ListSandboxesRequest, ListSandboxesResponse, PersistWorkspaceRequest,
        PersistWorkspaceResponse, ReadFileRequest, ReadFileResponse, Sandbox, StartSandboxRequest,
        StopSandboxRequest, WriteFileRequest, WriteFileResponse,
    },
};
use std::sync::Arc;
use temporalio_macros::activities;
use temporalio_sdk::activities::{ActivityContext, ActivityError};

pub struct SandboxActivities {
    core: Arc<Provisioner>,
    backends: Backends,
}

impl SandboxActivities {
    pub fn new(backends: &Backends) -> Self {
        Self {
            core: backends.local().clone(),
            backends: backends.clone(),
        }
    }
}

#[activities]
impl SandboxActivities {
    #[activity(definition = markers::local_sandbox::Create)]
    pub async fn create(
        self: Arc<Self>,
        _ctx: ActivityContext,
        req: CreateSandboxRequest,
    ) -> Result<Sandbox, ActivityError> {
        self.core
            .create(req)
            .await
            .map_err(|e| e.into_activity_error())
    }

    #[activity(definition = markers::local_sandbox::Health)]
    pub async fn health(
        self: Arc<Self>,
        _ctx: ActivityContext,
        req: HealthCheckRequest,
    ) -> Result<HealthCheckResponse, ActivityError> {
        self.core
            .health(req)
            .await
            .map_err(|e| e.into_activity_error())
    }

    /// Heartbeats while the command runs; cancellation drops the exec, which kills it.
    #[activity(definition = markers::local_sandbox::Exec)]
    pub async fn exec(
        self: Arc<Self>,
        ctx: ActivityContext,
        req: ExecRequest,
    ) -> Result<ExecResponse, ActivityError> {
        heartbeating(&ctx, self.core.exec(req)).await
    }

    #[activity(definition = markers::local_sandbox::CollectPatch)]
    pub async fn collect_patch(
        self: Arc<Self>,
        _ctx: ActivityContext,
        req: CollectPatchRequest,
    ) -> Result<CollectPatchResponse, ActivityError> {
        // Through the router: an idempotency key is honoured as over gRPC.
        self.backends
            .collect_patch(req)
            .await
            .map_err(|e| e.into_activity_error())
    }

    #[activity(definition = markers::local_sandbox::Destroy)]
    pub async fn destroy(
        self: Arc<Self>,
        _ctx: ActivityContext,
        req: DestroySandboxRequest,
    ) -> Result<DestroySandboxResponse, ActivityError> {
        self.core
            .destroy(req)
            .await
            .map_err(|e| e.into_activity_error())
    }

    #[activity(definition = markers::local_sandbox::Get)]
    pub async fn get(
        self: Arc<Self>,
        _ctx: ActivityContext,
        req: GetSandboxRequest,
    ) -> Result<Sandbox, ActivityError> {
        self.core
            .get(&req.sandbox_id)
            .map_err(|e| e.into_activity_error())
    }

    #[activity(definition = markers::local_sandbox::List)]
    pub async fn list(
        self: Arc<Self>,
        _ctx: ActivityContext,
        req: ListSandboxesRequest,
    ) -> Result<ListSandboxesResponse, ActivityError> {
        Ok(ListSandboxesResponse {
            sandboxes: self.core.list(&req.label_selector),
        })
    }

    #[activity(definition = markers::local_sandbox::ReadFile)]
    pub async fn read_file(
        self: Arc<Self>,
        _ctx: ActivityContext,
        req: ReadFileRequest,
    ) -> Result<ReadFileResponse, ActivityError> {
        self.core
            .read_file(req)
            .await
            .map_err(|e| e.into_activity_error())
    }

    #[activity(definition = markers::local_sandbox::WriteFile)]
    pub async fn write_file(
        self: Arc<Self>,
        _ctx: ActivityContext,
        req: WriteFileRequest,
    ) -> Result<WriteFileResponse, ActivityError> {
        self.core
            .write_file(req)
            .await
            .map_err(|e| e.into_activity_error())
    }

    #[activity(definition = markers::local_sandbox::Stop)]
    pub async fn stop(
        self: Arc<Self>,
        _ctx: ActivityContext,
        req: StopSandboxRequest,
    ) -> Result<Sandbox, ActivityError> {
        self.core
            .stop(req)
            .await
            .map_err(|e| e.into_activity_error())
    }

    #[activity(definition = markers::local_sandbox::Start)]
    pub async fn start(
        self: Arc<Self>,
        _ctx: ActivityContext,
        req: StartSandboxRequest,
    ) -> Result<Sandbox, ActivityError> {
        self.core
            .start(req)
            .await
            .map_err(|e| e.into_activity_error())
    }

    #[activity(definition = markers::local_sandbox::PersistWorkspace)]
    pub async fn persist_workspace(
        self: Arc<Self>,
        _ctx: ActivityContext,
        req: PersistWorkspaceRequest,
    ) -> Result<PersistWorkspaceResponse, ActivityError> {
        self.core
            .persist(req)
            .await
            .map_err(|e| e.into_activity_error())
    }

    #[activity(definition = markers::local_sandbox::HydrateWorkspace)]
    pub async fn hydrate_workspace(
        self: Arc<Self>,
        _ctx: ActivityContext,
        req: HydrateWorkspaceRequest,
    ) -> Result<Sandbox, ActivityError> {
        self.core
            .hydrate(req)
            .await
            .map_err(|e| e.into_activity_error())
    }

    #[activity(definition = markers::local_sandbox::Fork)]
    pub async fn fork(
        self: Arc<Self>,
        _ctx: ActivityContext,
        req: ForkSandboxRequest,
    ) -> Result<ForkSandboxResponse, ActivityError> {
        self.core
            .fork(req)
            .await
            .map_err(|e| e.into_activity_error())
    }
}

/// Await a long command while heartbeating every 5 s; a cancelled activity drops the
/// command's future, which kills it (local: kill-on-drop; e2b: the stream hangs up).
async fn heartbeating<T>(
    ctx: &ActivityContext,
    work: impl std::future::Future<Output = Result<T, crate::error::ProvisionerError>>,
) -> Result<T, ActivityError> {
    tokio::pin!(work);
    let mut beat = tokio::time::interval(std::time::Duration::from_secs(5));
    loop {
        tokio::select! {
            res = &mut work => return res.map_err(|e| e.into_activity_error()),
            _ = beat.tick() => { let _ = ctx.record_heartbeat(()).await; }
            () = ctx.cancelled() => return Err(ActivityError::cancelled()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn activities_carry_the_contract_names() {
        assert_eq!(SandboxActivities::create.name(), "local.create");
        assert_eq!(SandboxActivities::health.name(), "local.health");
        assert_eq!(
            SandboxActivities::collect_patch.name(),
            "local.collect_patch"
        );
        assert_eq!(SandboxActivities::destroy.name(), "local.destroy");
        assert_eq!(SandboxActivities::exec.name(), "local.exec");
        assert_eq!(SandboxActivities::fork.name(), "local.fork");
        assert_eq!(
            SandboxActivities::persist_workspace.name(),
            "local.persist_workspace"
        );
        assert_eq!(SandboxActivities::read_file.name(), "local.read_file");
    }
}

/// The Temporal front door for the `e2b` backend: `e2b.*` activities on the same queue,
/// over the same [`crate::SandboxBackend`] the gRPC service routes `e2b-` ids to.
pub struct E2bActivities {
    backend: Arc<dyn crate::backend::SandboxBackend>,
    backends: Backends,
}

impl E2bActivities {
    pub fn new(backends: &Backends) -> Self {
        Self {
            backend: backends.e2b().clone(),
            backends: backends.clone(),
        }
    }
}

fn force_backend(mut req: CreateSandboxRequest) -> CreateSandboxRequest {
    if req.backend.is_empty() {
        req.backend = crate::e2b::BACKEND.into();
    }
    req
}

#[activities]
impl E2bActivities {
    #[activity(definition = markers::e2b_sandbox::Create)]
    pub async fn create(
        self: Arc<Self>,
        _ctx: ActivityContext,
        req: CreateSandboxRequest,
    ) -> Result<Sandbox, ActivityError> {
        let req = force_backend(req);
        if req.backend != crate::e2b::BACKEND {
            return Err(crate::error::ProvisionerError::invalid(
                "backend",
                format!("e2b.create cannot create a {:?} sandbox", req.backend),
            )
            .into_activity_error());
        }
        self.backend
            .create(req)
            .await
            .map_err(|e| e.into_activity_error())
    }

    #[activity(definition = markers::e2b_sandbox::Health)]
    pub async fn health(
        self: Arc<Self>,
        _ctx: ActivityContext,
        req: HealthCheckRequest,
    ) -> Result<HealthCheckResponse, ActivityError> {
        self.backend
            .health(req)
            .await
            .map_err(|e| e.into_activity_error())
    }

    /// Heartbeats while the command runs; cancellation drops the stream (and the command
    /// with the connection; envd kills a process whose Start stream is gone).
    #[activity(definition = markers::e2b_sandbox::Exec)]
    pub async fn exec(
        self: Arc<Self>,
        ctx: ActivityContext,
        req: ExecRequest,
    ) -> Result<ExecResponse, ActivityError> {
        heartbeating(&ctx, self.backend.exec(req)).await
    }

    #[activity(definition = markers::e2b_sandbox::CollectPatch)]
    pub async fn collect_patch(
        self: Arc<Self>,
        _ctx: ActivityContext,
        req: CollectPatchRequest,
    ) -> Result<CollectPatchResponse, ActivityError> {
        // Through the router: an idempotency key is honoured as over gRPC.
        self.backends
            .collect_patch(req)
            .await
            .map_err(|e| e.into_activity_error())
    }

    #[activity(definition = markers::e2b_sandbox::Destroy)]
    pub async fn destroy(
        self: Arc<Self>,
        _ctx: ActivityContext,
        req: DestroySandboxRequest,
    ) -> Result<DestroySandboxResponse, ActivityError> {
        self.backend
            .destroy(req)
            .await
            .map_err(|e| e.into_activity_error())
    }

    #[activity(definition = markers::e2b_sandbox::Get)]
    pub async fn get(
        self: Arc<Self>,
        _ctx: ActivityContext,
        req: GetSandboxRequest,
    ) -> Result<Sandbox, ActivityError> {
        self.backend
            .get(&req.sandbox_id)
            .await
            .map_err(|e| e.into_activity_error())
    }

    #[activity(definition = markers::e2b_sandbox::List)]
    pub async fn list(
        self: Arc<Self>,
        _ctx: ActivityContext,
        req: ListSandboxesRequest,
    ) -> Result<ListSandboxesResponse, ActivityError> {
        let sandboxes = self
            .backend
            .list(&req.label_selector)
            .await
            .map_err(|e| e.into_activity_error())?;
        Ok(ListSandboxesResponse { sandboxes })
    }

    #[activity(definition = markers::e2b_sandbox::ReadFile)]
    pub async fn read_file(
        self: Arc<Self>,
        _ctx: ActivityContext,
        req: ReadFileRequest,
    ) -> Result<ReadFileResponse, ActivityError> {
        self.backend
            .read_file(req)
            .await
            .map_err(|e| e.into_activity_error())
    }

    #[activity(definition = markers::e2b_sandbox::WriteFile)]
    pub async fn write_file(
        self: Arc<Self>,
        _ctx: ActivityContext,
        req: WriteFileRequest,
    ) -> Result<WriteFileResponse, ActivityError> {
        self.backend
            .write_file(req)
            .await
            .map_err(|e| e.into_activity_error())
    }
}

#[cfg(test)]
mod e2b_tests {
    use super::*;

    #[test]
    fn e2b_activities_carry_the_backend_prefix() {
        assert_eq!(E2bActivities::create.name(), "e2b.create");
        assert_eq!(E2bActivities::exec.name(), "e2b.exec");
        assert_eq!(E2bActivities::destroy.name(), "e2b.destroy");
        assert_eq!(E2bActivities::health.name(), "e2b.health");
        assert_eq!(E2bActivities::collect_patch.name(), "e2b.collect_patch");
        assert_eq!(E2bActivities::list.name(), "e2b.list");
    }
}
