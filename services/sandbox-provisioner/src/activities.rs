//! The Temporal front door: `local.*` activities on queue `sandbox-provisioner`, over the
//! same [`Provisioner`] as the gRPC service.

use crate::provisioner::Provisioner;
use forkyard_proto::activities::markers;
use forkyard_proto::sandbox::v1::{
    CollectPatchRequest, CollectPatchResponse, CreateSandboxRequest, DestroySandboxRequest,
    DestroySandboxResponse, ExecRequest, ExecResponse, HealthCheckRequest, HealthCheckResponse,
    Sandbox,
};
use std::sync::Arc;
use temporalio_macros::activities;
use temporalio_sdk::activities::{ActivityContext, ActivityError};

pub struct SandboxActivities {
    core: Arc<Provisioner>,
}

impl SandboxActivities {
    pub fn new(core: Arc<Provisioner>) -> Self {
        Self { core }
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
        let exec = self.core.exec(req);
        tokio::pin!(exec);
        let mut beat = tokio::time::interval(std::time::Duration::from_secs(5));
        loop {
            tokio::select! {
                res = &mut exec => return res.map_err(|e| e.into_activity_error()),
                _ = beat.tick() => { let _ = ctx.record_heartbeat(()).await; }
                () = ctx.cancelled() => return Err(ActivityError::cancelled()),
            }
        }
    }

    #[activity(definition = markers::local_sandbox::CollectPatch)]
    pub async fn collect_patch(
        self: Arc<Self>,
        _ctx: ActivityContext,
        req: CollectPatchRequest,
    ) -> Result<CollectPatchResponse, ActivityError> {
        self.core
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
    }
}
