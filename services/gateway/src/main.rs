//! `gateway`: the public gRPC API and the worker hosting the run workflows.

use clap::Parser;
use forkyard_common::{exit_config_error, server, service, startup::Startup, tls::ClientAuth};
use forkyard_gateway::{
    activities::deliver::DeliverLocal,
    api::{self, ApiKeysService, GatewayService},
    config::Args,
    search_attributes, worker, workflows,
};
use forkyard_proto::gateway::v1::{api_keys_server::ApiKeysServer, gateway_server::GatewayServer};
use tonic::server::NamedService;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let startup = Startup {
        name: "gateway",
        tls: &args.tls,
        // Public callers authenticate with API keys.
        client_auth: ClientAuth::Optional,
        discovery: Some(&args.discovery),
        temporal: &args.temporal,
    };
    let listen = startup.check(&args.listen);
    let links = args.links().unwrap_or_else(|e| exit_config_error(e));
    args.check().unwrap_or_else(|e| exit_config_error(e));
    let listener = startup.bind(listen, Some(&args.metrics)).await;
    // Only the key file lives there (and only with api keys): created when it is opened.
    let (gate, mut tenancy, keys) = args
        .security
        .build(&args.state.state_dir, &args.ledger_addr)
        .await
        .unwrap_or_else(|e| exit_config_error(e));
    // Which backends a run may name: what the provisioners say they offer.
    tenancy.backends = tenancy.backends.asking(links.sandboxes.clone());
    let (listener, client) = temporal_ready(listener, &args).await?;
    let deliver = DeliverLocal::new(
        workflows::fork_results(client.clone()),
        tenancy.repos.clone(),
    );
    let api = args.api(client.clone(), links.agent_runner, tenancy);
    let (routes, health) =
        server::base_routes(<GatewayServer<GatewayService> as NamedService>::NAME)?;
    // The gate wraps the API only: health and reflection stay open for probes.
    let routes = routes
        .add_service(tower::Layer::layer(&gate, GatewayServer::new(api)))
        .add_service(tower::Layer::layer(
            &gate,
            ApiKeysServer::new(ApiKeysService::new(keys)),
        ));
    let options = worker::options(
        links.ledger,
        links.sandboxes,
        deliver,
        worker::Tasks {
            pollers: args.workflow_task_pollers,
            sticky_timeout: std::time::Duration::from_secs(args.sticky_timeout_secs),
        },
    )?;
    service::run_with_worker(
        service::Service {
            name: "gateway",
            listener,
            routes,
            health,
        },
        client,
        options,
    )
    .await
}

/// Temporal connected, its namespace holding the search attributes runs upsert, and the
/// cleanup schedule there; until then health says NOT_SERVING on `listener` (retried
/// with backoff), so a probe sees why.
async fn temporal_ready(
    listener: tokio::net::TcpListener,
    args: &Args,
) -> anyhow::Result<(tokio::net::TcpListener, temporalio_client::Client)> {
    let (listener, client) = forkyard_common::waiting::connect_while_not_serving(
        listener,
        <GatewayServer<GatewayService> as NamedService>::NAME,
        &args.temporal,
        "forkyard-gateway",
    )
    .await?;
    // The run workflow upserts these; without them its tasks would fail.
    let (listener, ()) = forkyard_common::waiting::not_serving_while(
        listener,
        <GatewayServer<GatewayService> as NamedService>::NAME,
        "the namespace lacks the search attributes runs need",
        search_attributes::wait_registered(
            &client,
            &args.temporal.namespace,
            args.register_search_attributes,
        ),
    )
    .await?;
    // A fresh deployment sweeps orphans without anyone asking.
    api::cleanup::ensure_default(
        &client,
        args.cleanup_interval_minutes,
        args.cleanup_max_age_minutes,
    )
    .await;
    Ok((listener, client))
}
