//! `janitor`: the orphan sweeper's gRPC server and Temporal worker.

use clap::Parser;
use forkyard_common::{
    StateDirArg, TemporalArgs, config::exit_config_error, server, service, startup::Startup,
    tls::ClientAuth,
};
use forkyard_janitor::{
    DEFAULT_LEDGER_ADDR, DEFAULT_LISTEN, DEFAULT_PROVISIONER_ADDR, GrpcSandboxes, JanitorService,
    LiveSweeper, Sweeper, activities, metrics::SweepMetrics, reservations::Ledger,
};
use forkyard_proto::janitor::v1::janitor_server::JanitorServer;
use std::sync::Arc;

#[derive(Debug, Parser)]
#[command(
    name = "janitor",
    about = "Forkyard janitor: destroys orphaned sandboxes"
)]
struct Args {
    /// gRPC listen address.
    #[arg(long, env = "FORKYARD_LISTEN", default_value = DEFAULT_LISTEN)]
    listen: String,
    /// gRPC address of the sandbox provisioner.
    #[arg(long, env = "FORKYARD_PROVISIONER_ADDR", default_value = DEFAULT_PROVISIONER_ADDR)]
    provisioner_addr: String,
    /// gRPC address of the budget ledger (stale reservations are released there).
    #[arg(long, env = "FORKYARD_LEDGER_ADDR", default_value = DEFAULT_LEDGER_ADDR)]
    ledger_addr: String,
    #[command(flatten)]
    metrics: forkyard_common::metrics::MetricsArgs,
    #[command(flatten)]
    temporal: TemporalArgs,
    /// Mesh TLS: this service's certificate, key and the mesh CA (mTLS when set).
    #[command(flatten)]
    tls: forkyard_common::tls::TlsArgs,
    #[command(flatten)]
    discovery: forkyard_common::discovery::DiscoveryArgs,
    #[command(flatten)]
    state: StateDirArg,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let startup = Startup {
        name: "janitor",
        tls: &args.tls,
        client_auth: ClientAuth::Required,
        discovery: Some(&args.discovery),
        temporal: &args.temporal,
    };
    let addr = startup.check(&args.listen);
    args.state.ensure().unwrap_or_else(|e| exit_config_error(e));
    let sandboxes = GrpcSandboxes::connect_lazy(&args.provisioner_addr).unwrap_or_else(|e| {
        exit_config_error(format!(
            "--provisioner-addr (FORKYARD_PROVISIONER_ADDR): {e}"
        ))
    });
    let ledger = Ledger::connect_lazy(&args.ledger_addr).unwrap_or_else(|e| {
        exit_config_error(format!("--ledger-addr (FORKYARD_LEDGER_ADDR): {e}"))
    });
    // The process registry is served once the sweep counters are in it; bound now, with
    // the gRPC port, before logging starts.
    let metrics_listener = args.metrics.bind("janitor").await;
    let listener = startup.bind(addr, None).await;
    // The process registry: the sweep counters beside the run, gRPC and Temporal metrics.
    let sweep_metrics = SweepMetrics::register(forkyard_common::metrics::registry())?;
    forkyard_common::metrics::serve_registry(metrics_listener);
    // Until Temporal answers, health says NOT_SERVING on this port (retried with backoff).
    let (listener, client) = forkyard_common::waiting::connect_while_not_serving(
        listener,
        <JanitorServer<JanitorService<GrpcSandboxes, temporalio_client::Client>> as tonic::server::NamedService>::NAME,
        &args.temporal,
        "janitor",
    )
    .await?;
    let sweeper: Arc<LiveSweeper> = Arc::new(
        Sweeper::new(sandboxes, client.clone())
            .with_ledger(ledger)
            .with_metrics(sweep_metrics),
    );

    let (routes, health) = server::base_routes(
        <JanitorServer<JanitorService<GrpcSandboxes, temporalio_client::Client>> as tonic::server::NamedService>::NAME,
    )?;
    let routes = routes.add_service(JanitorService::new(sweeper.clone()).into_server());

    service::run_with_worker(
        service::Service {
            name: "janitor",
            listener,
            routes,
            health,
        },
        client,
        activities::worker_options(sweeper),
    )
    .await
}
