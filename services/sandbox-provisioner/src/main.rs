//! `sandbox-provisioner`: gRPC `forkyard.sandbox.v1.SandboxProvisioner` plus the Temporal
//! worker for the `local.*` sandbox activities.
#![forbid(unsafe_code)]

use clap::Parser;
use forkyard_common::{exit_config_error, server, service, telemetry, temporal};
use forkyard_proto::{queues, sandbox::v1::sandbox_provisioner_server::SandboxProvisionerServer};
use forkyard_sandbox_provisioner::{
    Args, E2bActivities, Provisioner, SandboxActivities, SandboxService,
};
use tonic::server::NamedService;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let (listen, config) = args.resolve().unwrap_or_else(|e| exit_config_error(e));
    if let Err(e) = args.temporal.url() {
        exit_config_error(e);
    }
    telemetry::init("sandbox-provisioner");
    let core = Provisioner::open(config)
        .await
        .unwrap_or_else(|e| exit_config_error(e));
    let listener = server::bind(listen)
        .await
        .unwrap_or_else(|e| exit_config_error(format!("FORKYARD_LISTEN (--listen): {e}")));

    let (routes, health) =
        server::base_routes(<SandboxProvisionerServer<SandboxService> as NamedService>::NAME)?;
    let routes = routes.add_service(SandboxService::new(core.clone()).into_server());

    let client = temporal::connect(&args.temporal, "sandbox-provisioner").await?;
    let options = temporalio_sdk::WorkerOptions::new(queues::SANDBOX_PROVISIONER)
        .register_activities(E2bActivities::new(&core))
        .register_activities(SandboxActivities::new(core))
        .build();
    service::run_with_worker(
        service::Service {
            name: "sandbox-provisioner",
            listener,
            routes,
            health,
        },
        client,
        options,
    )
    .await
}
