//! `budget-ledger`: the ledger's gRPC server and Temporal worker.

use clap::Parser;
use forkyard_budget_ledger::{DEFAULT_LISTEN, LedgerService, LedgerStore, activities};
use forkyard_common::{
    StateDirArg, TemporalArgs, config::exit_config_error, server, service, startup::Startup,
    tls::ClientAuth,
};
use forkyard_proto::budget::v1::budget_ledger_server::BudgetLedgerServer;
use std::sync::Arc;

#[derive(Debug, Parser)]
#[command(
    name = "budget-ledger",
    about = "Forkyard budget ledger: gRPC server and Temporal worker"
)]
struct Args {
    /// gRPC listen address.
    #[arg(long, env = "FORKYARD_LISTEN", default_value = DEFAULT_LISTEN)]
    listen: String,
    /// Ledger database URL; defaults to `sqlite://<state-dir>/ledger.db`.
    #[arg(long, env = "FORKYARD_LEDGER_DATABASE_URL")]
    database_url: Option<String>,
    #[command(flatten)]
    temporal: TemporalArgs,
    /// Mesh TLS: this service's certificate, key and the mesh CA (mTLS when set).
    #[command(flatten)]
    tls: forkyard_common::tls::TlsArgs,
    #[command(flatten)]
    state: StateDirArg,
    #[command(flatten)]
    metrics: forkyard_common::metrics::MetricsArgs,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let startup = Startup {
        name: "budget-ledger",
        tls: &args.tls,
        client_auth: ClientAuth::Required,
        discovery: None,
        temporal: &args.temporal,
    };
    let addr = startup.check(&args.listen);
    let state_dir = args.state.ensure().unwrap_or_else(|e| exit_config_error(e));
    // Before the database: a port in use is the first line a pod prints.
    let listener = startup.bind(addr, Some(&args.metrics)).await;

    let store = match &args.database_url {
        Some(url) => LedgerStore::connect(url).await,
        None => LedgerStore::open_file(&state_dir.join("ledger.db")).await,
    }
    .unwrap_or_else(|e| {
        exit_config_error(format!(
            "--database-url (FORKYARD_LEDGER_DATABASE_URL): {e}"
        ))
    });
    let store = Arc::new(store);

    let (routes, health) = server::base_routes(
        <BudgetLedgerServer<LedgerService> as tonic::server::NamedService>::NAME,
    )?;
    let routes = routes.add_service(LedgerService::new(store.clone()).into_server());

    // Until Temporal answers, health says NOT_SERVING on this port (retried with backoff).
    let (listener, client) = forkyard_common::waiting::connect_while_not_serving(
        listener,
        <BudgetLedgerServer<LedgerService> as tonic::server::NamedService>::NAME,
        &args.temporal,
        "budget-ledger",
    )
    .await?;
    service::run_with_worker(
        service::Service {
            name: "budget-ledger",
            listener,
            routes,
            health,
        },
        client,
        activities::worker_options(store),
    )
    .await
}
