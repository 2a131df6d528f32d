//! `agent-runner`: runs agents inside sandboxes as the `agent.run` activity.

use clap::Parser;
use forkyard_agent_runner::{activities::AgentActivities, config::Args, grpc::AgentRunnerService};
use forkyard_common::{exit_config_error, server, service, startup::Startup, tls::ClientAuth};
use forkyard_proto::{agent::v1::agent_runner_server::AgentRunnerServer, queues};
use temporalio_sdk::WorkerOptions;
use tonic::server::NamedService;

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
    let config = args
        .resolve(listen)
        .await
        .unwrap_or_else(|e| exit_config_error(e));
    let listener = startup.bind(listen, Some(&args.metrics)).await;
    let runner = config.runner().unwrap_or_else(|e| exit_config_error(e));
    let name = <AgentRunnerServer<AgentRunnerService> as NamedService>::NAME;
    let (routes, health) = server::base_routes(name)?;
    let routes = routes.add_service(AgentRunnerServer::new(AgentRunnerService {
        runner: runner.clone(),
    }));

    // Until Temporal answers, health says NOT_SERVING on this port (retried with backoff).
    let (listener, client) = forkyard_common::waiting::connect_while_not_serving(
        listener,
        name,
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
