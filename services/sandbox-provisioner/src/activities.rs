//! The Temporal front door: `local.*` activities on queue `sandbox-provisioner`, over the
//! same [`Provisioner`] as the gRPC service.

use crate::provisioner::Provisioner;
use forkyard_proto::activities::LocalSandbox;
use forkyard_proto::sandbox::v1::{
    CollectPatchRequest, CollectPatchResponse, CreateSandboxRequest, DestroySandboxRequest,
    DestroySandboxResponse, HealthCheckRequest, HealthCheckResponse, Sandbox,
};
use std::sync::Arc;
use temporalio_common::ActivityDefinition;
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

// The contract's marker types sit in a private module of forkyard-proto, so
// `#[activity(definition = ...)]` cannot name them from here. Each activity takes its name
// from the contract instead, and `contracts_match` checks the input and output types.
#[activities]
impl SandboxActivities {
    #[activity(name = ActivityDefinition::name(&LocalSandbox::create))]
    pub async fn create(self: Arc<Self>, _ctx: ActivityContext, req: CreateSandboxRequest) -> Result<Sandbox, ActivityError> {
        self.core.create(req).await.map_err(|e| e.into_activity_error())
    }

    #[activity(name = ActivityDefinition::name(&LocalSandbox::health))]
    pub async fn health(self: Arc<Self>, _ctx: ActivityContext, req: HealthCheckRequest) -> Result<HealthCheckResponse, ActivityError> {
        self.core.health(req).await.map_err(|e| e.into_activity_error())
    }

    #[activity(name = ActivityDefinition::name(&LocalSandbox::collect_patch))]
    pub async fn collect_patch(
        self: Arc<Self>,
        _ctx: ActivityContext,
        req: CollectPatchRequest,
    ) -> Result<CollectPatchResponse, ActivityError> {
        self.core.collect_patch(req).await.map_err(|e| e.into_activity_error())
    }

    #[activity(name = ActivityDefinition::name(&LocalSandbox::destroy))]
    pub async fn destroy(
        self: Arc<Self>,
        _ctx: ActivityContext,
        req: DestroySandboxRequest,
    ) -> Result<DestroySandboxResponse, ActivityError> {
        self.core.destroy(req).await.map_err(|e| e.into_activity_error())
    }
}

/// Compile-time check that each activity has its contract's input and output.
#[allow(dead_code)]
fn contracts_match() {
    fn same<D: ActivityDefinition<Input = I, Output = O>, I, O>(_: D, _: fn(I) -> O) {}
    same(LocalSandbox::create, |_: CreateSandboxRequest| -> Sandbox { unreachable!() });
    same(LocalSandbox::health, |_: HealthCheckRequest| -> HealthCheckResponse { unreachable!() });
    same(LocalSandbox::collect_patch, |_: CollectPatchRequest| -> CollectPatchResponse { unreachable!() });
    same(LocalSandbox::destroy, |_: DestroySandboxRequest| -> DestroySandboxResponse { unreachable!() });
    same(SandboxActivities::create, |_: CreateSandboxRequest| -> Sandbox { unreachable!() });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn activities_carry_the_contract_names() {
        assert_eq!(SandboxActivities::create.name(), "local.create");
        assert_eq!(SandboxActivities::health.name(), "local.health");
        assert_eq!(SandboxActivities::collect_patch.name(), "local.collect_patch");
        assert_eq!(SandboxActivities::destroy.name(), "local.destroy");
    }
}
