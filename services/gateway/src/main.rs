//! `gateway`: the public gRPC API and the worker hosting the run workflows.

use clap::Parser;
use forkyard_common::{
    StateDirArg, TemporalArgs, exit_config_error, server, service,
    startup::Startup,
    tls::{ClientAuth, TlsArgs},
};
use forkyard_gateway::{
    api::{AgentRunnerLink, GatewayService, ReadLimits},
    auth::config::SecurityArgs,
    ledger::LedgerLocal,
    sandboxes::SandboxLocal,
    search,
    validate::Limits,
    wave::WaveLocal,
    workflows::{ForkWorkflow, SandboxOrchestrationWorkflow, cleanup::ScheduledCleanupWorkflow},
};
use forkyard_proto::{gateway::v1::gateway_server::GatewayServer, queues};
use temporalio_sdk::{WorkerOptions, runtime::PollerBehavior};
use tonic::server::NamedService;

#[derive(Debug, Parser)]
#[command(
    name = "gateway",
    version,
    about = "Forkyard gateway: the public run API and the workflow worker"
)]
struct Args {
    /// Address the gRPC API listens on.
    #[arg(long, env = "FORKYARD_LISTEN", default_value = "127.0.0.1:50051")]
    listen: String,
    /// Largest number of forks one run may ask for (at most 1300: the run's history).
    #[arg(long, env = "FORKYARD_MAX_FORKS", default_value_t = 1000)]
    max_forks: u32,
    /// Runs of up to this many forks run their forks' steps in the run's own workflow
    /// (fewer Temporal operations per fork); larger runs give each fork a child workflow
    /// of its own, which keeps the run's history small. 0: always child workflows. At
    /// most 300: the run's history holds its inline forks' agent events and patches.
    #[arg(long, env = "FORKYARD_INLINE_FORK_LIMIT", default_value_t = forkyard_gateway::validate::DEFAULT_INLINE_FORK_LIMIT)]
    inline_fork_limit: u32,
    /// budget-ledger's gRPC endpoint; the run workflows' ledger calls go there as local
    /// activities of this worker.
    #[arg(
        long,
        env = "FORKYARD_LEDGER_ADDR",
        default_value = "http://127.0.0.1:50054"
    )]
    ledger_addr: String,
    /// sandbox-provisioner's gRPC endpoint (several separated by commas are balanced):
    /// the fork workflows' sandbox control calls go there as local activities of this
    /// worker; calls about an existing sandbox go to its owner replica.
    #[arg(
        long,
        env = "FORKYARD_PROVISIONER_ADDR",
        default_value = "http://127.0.0.1:50052"
    )]
    provisioner_addr: String,
    /// Concurrent workflow-task polls (sticky and normal queues together). Unset: the
    /// SDK's default (5, or poller autoscaling where the server offers it).
    #[arg(long, env = "FORKYARD_WORKFLOW_TASK_POLLERS")]
    workflow_task_pollers: Option<usize>,
    /// The agent runner asked at launch whether it can run an LLM agent spec (model
    /// alias, API key) and for fork transcripts.
    #[arg(
        long,
        env = "FORKYARD_AGENT_RUNNER_ADDR",
        default_value = "http://127.0.0.1:50053"
    )]
    agent_runner_addr: String,
    /// How long this replica serves a running run's view (GetRun, WatchRun) before it
    /// asks Temporal again; a write through this replica refreshes it at once. Closed
    /// runs are kept without asking again.
    #[arg(long, env = "FORKYARD_RUN_VIEW_TTL_MS", default_value_t = 500)]
    run_view_ttl_ms: u64,
    /// Most run views fetched from Temporal at once; a read that cannot start its fetch
    /// within 2 s is refused with UNAVAILABLE rather than queued.
    #[arg(long, env = "FORKYARD_RUN_VIEW_FETCHES", default_value_t = 32)]
    run_view_fetches: usize,
    #[command(flatten)]
    temporal: TemporalArgs,
    #[command(flatten)]
    metrics: forkyard_common::metrics::MetricsArgs,
    #[command(flatten)]
    security: SecurityArgs,
    #[command(flatten)]
    tls: TlsArgs,
    #[command(flatten)]
    discovery: forkyard_common::discovery::DiscoveryArgs,
    #[command(flatten)]
    state: StateDirArg,
}

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
    let ledger = LedgerLocal::new(&args.ledger_addr).unwrap_or_else(|e| exit_config_error(e));
    let sandboxes =
        SandboxLocal::new(&args.provisioner_addr).unwrap_or_else(|e| exit_config_error(e));
    let agent_runner =
        AgentRunnerLink::new(&args.agent_runner_addr).unwrap_or_else(|e| exit_config_error(e));
    if args.run_view_fetches == 0 {
        exit_config_error("--run-view-fetches (FORKYARD_RUN_VIEW_FETCHES) must be at least 1");
    }
    if args.workflow_task_pollers.is_some_and(|n| n < 2) {
        exit_config_error(
            "--workflow-task-pollers (FORKYARD_WORKFLOW_TASK_POLLERS) must be at least 2",
        );
    }
    if args.max_forks == 0 {
        exit_config_error("--max-forks (FORKYARD_MAX_FORKS) must be at least 1");
    }
    // About 5 events of the run's own history per fork, more for forks that wait for
    // budget or are retried (see workflows::orchestration): room for those.
    if args.max_forks > 1300 {
        exit_config_error(
            "--max-forks (FORKYARD_MAX_FORKS) must be at most 1300: a larger run's history could come near Temporal's 10,240-event warning",
        );
    }
    if args.inline_fork_limit > forkyard_gateway::validate::MAX_INLINE_FORK_LIMIT {
        exit_config_error(format!(
            "--inline-fork-limit (FORKYARD_INLINE_FORK_LIMIT) must be at most {}, the most forks a run may have",
            forkyard_gateway::validate::MAX_INLINE_FORK_LIMIT
        ));
    }
    if let Err(e) = args.security.check_policies(&args.state.state_dir) {
        exit_config_error(e);
    }
    let listener = startup.bind(listen, Some(&args.metrics)).await;
    // Only the key file lives there (and only with api keys): created when it is opened.
    let state_dir = args.state.state_dir.clone();
    let (gate, tenancy) = args
        .security
        .build(&state_dir, &args.ledger_addr)
        .await
        .unwrap_or_else(|e| exit_config_error(e));
    // Until Temporal answers, health says NOT_SERVING on this port (retried with backoff).
    let (listener, client) = forkyard_common::waiting::connect_while_not_serving(
        listener,
        <GatewayServer<GatewayService> as NamedService>::NAME,
        &args.temporal,
        "forkyard-gateway",
    )
    .await?;
    // The run workflow upserts these; without them its tasks would fail.
    if let Err(e) = search::ensure_registered(&client, &args.temporal.namespace).await {
        exit_config_error(e);
    }
    let api = GatewayService::new(
        client.clone(),
        Limits {
            max_forks: args.max_forks,
            inline_fork_limit: args.inline_fork_limit,
        },
    )
    .with_agent_runner(agent_runner)
    .with_tenancy(tenancy)
    .with_deadline(args.security.deadline())
    .with_read_limits(ReadLimits {
        live_ttl: std::time::Duration::from_millis(args.run_view_ttl_ms),
        max_fetches: args.run_view_fetches,
        ..ReadLimits::default()
    });
    let (routes, health) =
        server::base_routes(<GatewayServer<GatewayService> as NamedService>::NAME)?;
    // The gate wraps the API only: health and reflection stay open for probes.
    let routes = routes.add_service(tower::Layer::layer(&gate, GatewayServer::new(api)));

    let options = WorkerOptions::new(queues::ORCHESTRATION)
        .register_workflow::<SandboxOrchestrationWorkflow>()?
        .register_workflow::<ForkWorkflow>()?
        .register_workflow::<ScheduledCleanupWorkflow>()?
        .worker_plugin(forkyard_gateway::fork_telemetry::plugin())
        .register_activities(WaveLocal::new(&ledger, &sandboxes))
        .register_activities(ledger)
        .register_activities(sandboxes)
        .maybe_workflow_task_poller_behavior(
            args.workflow_task_pollers
                .map(PollerBehavior::SimpleMaximum),
        )
        .build();
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
