//! `agent-runner`: runs agents inside sandboxes as the `agent.run` activity.

use clap::Parser;
use forkyard_agent_runner::{
    activities::AgentActivities,
    grpc::{AgentRunnerService, Provisioners},
};
use forkyard_common::{
    TemporalArgs, config::parse_listen, exit_config_error, server, service, telemetry, temporal,
};
use forkyard_proto::{agent::v1::agent_runner_server::AgentRunnerServer, queues};
use std::time::Duration;
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
    #[command(flatten)]
    temporal: TemporalArgs,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let listen = parse_listen("--listen (FORKYARD_LISTEN)", &args.listen)
        .unwrap_or_else(|e| exit_config_error(e));
    if let Err(e) = args.temporal.url() {
        exit_config_error(e);
    }
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
    // Bound before logging starts, so a port in use is the first line a pod prints.
    let listener = server::bind(listen)
        .await
        .unwrap_or_else(|e| exit_config_error(format!("--listen (FORKYARD_LISTEN): {e}")));
    telemetry::init("agent-runner");
    let provisioners = Provisioners::new(args.provisioner_addr.clone());
    let (routes, health) =
        server::base_routes(<AgentRunnerServer<AgentRunnerService> as NamedService>::NAME)?;
    let routes = routes.add_service(AgentRunnerServer::new(AgentRunnerService {
        provisioners: provisioners.clone(),
    }));

    let client = temporal::connect(&args.temporal, "forkyard-agent-runner").await?;
    let activities = AgentActivities {
        provisioners,
        heartbeat: Duration::from_secs(args.heartbeat_secs),
    };
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
