//! `agent-runner`: runs agents inside sandboxes as the `agent.run` activity.

use clap::Parser;
use forkyard_agent_runner::{
    activities::AgentActivities,
    drivers::Drivers,
    grpc::AgentRunnerService,
    llm_gateway::LlmGateway,
    models::Models,
    provisioners::Provisioners,
    runner::{Runner, short_call_channel},
    transcript::ArtifactStore,
};
use forkyard_common::{
    TemporalArgs,
    config::{StateDirArg, parse_listen},
    exit_config_error, server, service,
    startup::Startup,
    tls::ClientAuth,
};
use forkyard_proto::{agent::v1::agent_runner_server::AgentRunnerServer, queues};
use std::{path::PathBuf, sync::Arc, time::Duration};
use temporalio_sdk::WorkerOptions;
use tonic::server::NamedService;

#[derive(Debug, Parser)]
#[command(
    name = "agent-runner",
    version,
    about = "Forkyard agent runner: runs one agent inside one sandbox"
)]
struct Args {
    /// Address the gRPC API listens on.
    #[arg(long, env = "FORKYARD_LISTEN", default_value = "127.0.0.1:50053")]
    listen: String,
    /// gRPC endpoint other services reach this replica at (a URL); each agent's result
    /// names it as where its transcript is, since transcripts stay in this replica's
    /// artifact store. Default `http://<listen>`, with the host name for 0.0.0.0 / ::.
    #[arg(long, env = "FORKYARD_AGENT_RUNNER_ADVERTISE_ADDR")]
    advertise_addr: Option<String>,
    /// Address the metering LLM gateway listens on: every command-like agent (command,
    /// claude-code, codex) reaches its model there, through its provisioner's relay.
    /// Empty: off (agents get no model access; the presets refuse to run).
    #[arg(long, env = "FORKYARD_LLM_LISTEN", default_value = "127.0.0.1:50056")]
    llm_listen: String,
    /// The LLM gateway's address as provisioners reach it (`http://host:port`). Default
    /// `http://<llm-listen>`, with the host name when listening on 0.0.0.0 or ::.
    #[arg(long, env = "FORKYARD_LLM_ADVERTISE_ADDR")]
    llm_advertise_addr: Option<String>,
    /// The sandbox provisioner used when a sandbox names no owner replica.
    #[arg(
        long,
        env = "FORKYARD_PROVISIONER_ADDR",
        default_value = "http://127.0.0.1:50052"
    )]
    provisioner_addr: String,
    /// Seconds between heartbeats of a running agent (the workflow allows 20 s of silence).
    #[arg(long, env = "FORKYARD_HEARTBEAT_SECS", default_value_t = 5)]
    heartbeat_secs: u64,
    /// The budget ledger LLM drivers charge each model turn to.
    #[arg(
        long,
        env = "FORKYARD_LEDGER_ADDR",
        default_value = "http://127.0.0.1:50054"
    )]
    ledger_addr: String,
    /// JSON file with model aliases and prices (USD per million tokens), laid over the
    /// built-in table. API keys and base URLs come from ANTHROPIC_API_KEY,
    /// ANTHROPIC_BASE_URL, OPENAI_API_KEY and OPENAI_BASE_URL.
    #[arg(long, env = "FORKYARD_MODELS_FILE")]
    models_file: Option<PathBuf>,
    /// Tries per model API call (the first included) on 429/529/5xx and network errors,
    /// with exponential backoff from 1 s; then the activity fails and Temporal retries it.
    #[arg(long, env = "FORKYARD_MODEL_RETRIES", default_value_t = 6)]
    model_retries: u32,
    /// Most model turns of an LLM agent whose spec sets none.
    #[arg(long, env = "FORKYARD_MAX_TURNS", default_value_t = 50)]
    max_turns: u32,
    #[command(flatten)]
    state: StateDirArg,
    #[command(flatten)]
    temporal: TemporalArgs,
    #[command(flatten)]
    metrics: forkyard_common::metrics::MetricsArgs,
    /// Mesh TLS: this service's certificate, key and the mesh CA (mTLS when set).
    #[command(flatten)]
    tls: forkyard_common::tls::TlsArgs,
    #[command(flatten)]
    discovery: forkyard_common::discovery::DiscoveryArgs,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let startup = Startup {
        name: "agent-runner",
        tls: &args.tls,
        client_auth: ClientAuth::Required,
        discovery: Some(&args.discovery),
        temporal: &args.temporal,
    };
    let listen = startup.check(&args.listen);
    let advertise = forkyard_common::advertise::resolve(
        "--advertise-addr (FORKYARD_AGENT_RUNNER_ADVERTISE_ADDR)",
        args.advertise_addr.as_deref(),
        listen,
    )
    .unwrap_or_else(|e| exit_config_error(e));
    if tonic::transport::Endpoint::from_shared(args.provisioner_addr.clone()).is_err() {
        exit_config_error(format!(
            "--provisioner-addr (FORKYARD_PROVISIONER_ADDR) {:?} is not a URL",
            args.provisioner_addr
        ));
    }
    if !(1..=15).contains(&args.heartbeat_secs) {
        exit_config_error(
            "--heartbeat-secs (FORKYARD_HEARTBEAT_SECS) must be 1-15 (the heartbeat timeout is 20 s)",
        );
    }
    let llm = if args.llm_listen.trim().is_empty() {
        None
    } else {
        let setting = "--llm-listen (FORKYARD_LLM_LISTEN)";
        let addr = parse_listen(setting, &args.llm_listen).unwrap_or_else(|e| exit_config_error(e));
        let advertise = forkyard_common::advertise::resolve(
            "--llm-advertise-addr (FORKYARD_LLM_ADVERTISE_ADDR)",
            args.llm_advertise_addr.as_deref(),
            addr,
        )
        .unwrap_or_else(|e| exit_config_error(e));
        let l = tokio::net::TcpListener::bind(addr)
            .await
            .unwrap_or_else(|e| exit_config_error(format!("{setting}: {e}")));
        Some((l, advertise))
    };
    let ledger = short_call_channel("--ledger-addr (FORKYARD_LEDGER_ADDR)", &args.ledger_addr)
        .unwrap_or_else(|e| exit_config_error(e));
    let models = Models::load(args.models_file.as_deref())
        .unwrap_or_else(|e| exit_config_error(format!("--models-file (FORKYARD_MODELS_FILE) {e}")));
    if args.max_turns == 0 {
        exit_config_error("--max-turns (FORKYARD_MAX_TURNS) must be at least 1");
    }
    let state = args.state.ensure().unwrap_or_else(|e| exit_config_error(e));
    if !(1..=20).contains(&args.model_retries) {
        exit_config_error("--model-retries (FORKYARD_MODEL_RETRIES) must be 1-20");
    }
    let mut drivers = Drivers::from_env(models);
    drivers.max_turns = args.max_turns;
    drivers.anthropic.retry.attempts = args.model_retries;
    drivers.openai.retry.attempts = args.model_retries;
    let listener = startup.bind(listen, Some(&args.metrics)).await;
    let llm_gateway = llm.map(|(listener, advertise)| {
        let gw = Arc::new(LlmGateway::new(
            drivers.anthropic.clone(),
            drivers.openai.clone(),
            drivers.models.clone(),
            advertise,
        ));
        tracing::info!(listen = %args.llm_listen, advertise = %gw.advertise, "llm gateway serving");
        let tls = forkyard_common::tls::mesh().map(|t| {
            t.rustls_server().unwrap_or_else(|e| {
                exit_config_error(format!("--tls-cert (FORKYARD_TLS_CERT): {e}"))
            })
        });
        tokio::spawn(forkyard_agent_runner::llm_gateway::serve(
            gw.clone(),
            listener,
            tls,
            tokio_util::sync::CancellationToken::new(),
        ));
        gw
    });
    let runner = Runner {
        llm_gateway,
        provisioners: Provisioners::new(args.provisioner_addr.clone()),
        ledger,
        drivers: Arc::new(drivers),
        store: Some(ArtifactStore::new(state.join("artifacts"))),
        heartbeat: Duration::from_secs(args.heartbeat_secs),
        advertise,
    };
    let (routes, health) =
        server::base_routes(<AgentRunnerServer<AgentRunnerService> as NamedService>::NAME)?;
    let routes = routes.add_service(AgentRunnerServer::new(AgentRunnerService {
        runner: runner.clone(),
    }));

    // Until Temporal answers, health says NOT_SERVING on this port (retried with backoff).
    let (listener, client) = forkyard_common::waiting::connect_while_not_serving(
        listener,
        <AgentRunnerServer<AgentRunnerService> as NamedService>::NAME,
        &args.temporal,
        "forkyard-agent-runner",
    )
    .await?;
    let activities = AgentActivities { runner };
    let options = WorkerOptions::new(queues::AGENT_RUNNER)
        .register_activities(activities)
        .build();
    service::run_with_worker(
        service::Service {
            name: "agent-runner",
            listener,
            routes,
            health,
        },
        client,
        options,
    )
    .await
}
