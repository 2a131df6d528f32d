//! `sandbox-provisioner`: gRPC `forkyard.sandbox.v1.SandboxProvisioner` plus the Temporal
//! worker for the `local.*` sandbox activities.
#![forbid(unsafe_code)]

use clap::Parser;
use forkyard_common::{exit_config_error, server, service, startup::Startup, tls::ClientAuth};
use forkyard_proto::{queues, sandbox::v1::sandbox_provisioner_server::SandboxProvisionerServer};
use forkyard_sandbox_provisioner::{
    Args, Backends, E2bActivities, Provisioner, SandboxActivities, SandboxService,
};
use tonic::server::NamedService;
use tracing::info;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let startup = Startup {
        name: "sandbox-provisioner",
        tls: &args.tls,
        client_auth: ClientAuth::Required,
        discovery: None,
        temporal: &args.temporal,
    };
    let listen = startup.check(&args.listen);
    let (_, config, e2b) = args.resolve().unwrap_or_else(|e| exit_config_error(e));
    // Before the slow start-up: a port in use is the first line a pod prints.
    let listener = startup.bind(listen, Some(&args.metrics)).await;
    let core = Provisioner::open(config)
        .await
        .unwrap_or_else(|e| exit_config_error(e));
    core.keep_cgroups_at_exit();
    core.probe_isolations_in_background();
    let backends = Backends::open(core.clone(), e2b).unwrap_or_else(|e| exit_config_error(e));

    let (routes, health) =
        server::base_routes(<SandboxProvisionerServer<SandboxService> as NamedService>::NAME)?;
    let routes = routes.add_service(SandboxService::with_backends(backends.clone()).into_server());

    // Until Temporal answers, health says NOT_SERVING on this port (retried with backoff).
    let (listener, client) = forkyard_common::waiting::connect_while_not_serving(
        listener,
        <SandboxProvisionerServer<SandboxService> as NamedService>::NAME,
        &args.temporal,
        "sandbox-provisioner",
    )
    .await?;
    // Creates come through the shared queue; every later activity about a sandbox is
    // sent to its owner's own queue (`owner_task_queue`), which only this replica polls.
    // Both serve every activity, so callers that ignore the owner still work on one
    // replica.
    let owner_queue = core.owner_task_queue().to_owned();
    info!(task_queue = %owner_queue, "polling this replica's own task queue");
    let options = worker_options(&backends, &owner_queue);
    // On SIGTERM: no new sandboxes here; the forks using the ones held finish first.
    let drain_timeout = std::time::Duration::from_secs(args.drain_timeout_secs);
    let drain: service::Drain = Box::pin(async move {
        core.start_draining();
        core.drained(drain_timeout).await;
    });
    service::run_with_workers_draining(
        service::Service {
            name: "sandbox-provisioner",
            listener,
            routes,
            health,
        },
        client,
        options,
        Some(drain),
    )
    .await
}

/// A worker of the shared queue and one of `owner_queue`, each serving every activity.
fn worker_options(backends: &Backends, owner_queue: &str) -> Vec<temporalio_sdk::WorkerOptions> {
    [queues::SANDBOX_PROVISIONER, owner_queue]
        .into_iter()
        .map(|queue| {
            temporalio_sdk::WorkerOptions::new(queue)
                .register_activities(E2bActivities::new(backends))
                .register_activities(SandboxActivities::new(backends))
                .build()
        })
        .collect()
}
