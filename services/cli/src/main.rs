//! `forkyard`: the command line for the gateway API.
//!
//! Exit codes: 0 success (with `--wait`: every fork succeeded); 1 an error (bad input,
//! gateway unreachable, run not found); 2 the run finished but some fork did not succeed;
//! 3 the run was cancelled, failed or timed out.

mod table;

use clap::{Parser, Subcommand, ValueEnum};
use forkyard_proto::{
    common::v1::AgentSpec,
    gateway::v1::{
        CancelRunRequest, GetRunRequest, LaunchRunRequest, ListRunsRequest, Run, RunState,
        gateway_client::GatewayClient,
    },
};
use std::{process::ExitCode, time::Duration};
use tonic::transport::Channel;

#[derive(Debug, Parser)]
#[command(
    name = "forkyard",
    version,
    about = "Run one prompt on one repo as N parallel agent forks"
)]
struct Cli {
    /// Gateway gRPC endpoint.
    #[arg(
        long,
        global = true,
        env = "FORKYARD_GATEWAY",
        default_value = "http://127.0.0.1:50051"
    )]
    gateway: String,
    /// Output format of read commands.
    #[arg(long, short = 'o', global = true, value_enum, default_value_t = Output::Table)]
    output: Output,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Output {
    Table,
    Json,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Launch a run: the prompt on the repo, as N forks.
    Fork(ForkArgs),
    /// Show a run and its forks.
    Status { run_id: String },
    /// List runs, newest first.
    List {
        #[arg(long, default_value_t = 20)]
        limit: u32,
    },
    /// Cancel a run: its forks stop and their sandboxes are destroyed.
    Cancel {
        run_id: String,
        #[arg(long, default_value = "")]
        reason: String,
    },
}

#[derive(Debug, clap::Args)]
struct ForkArgs {
    /// Git URL or local path of the repository.
    repo: String,
    #[arg(short, long)]
    prompt: String,
    #[arg(short = 'f', long, default_value_t = 3)]
    forks: u32,
    #[arg(long, default_value_t = 3)]
    max_concurrent: u32,
    /// Total budget in US dollars, e.g. 10 or 2.50.
    #[arg(long, default_value = "10")]
    budget: String,
    /// Shell command each fork runs in its sandbox; the prompt is in $FORKYARD_PROMPT.
    #[arg(long)]
    agent_command: String,
    /// Branch prefix: fork n works on <branch>-fork-<n>.
    #[arg(short, long, default_value = "forkyard")]
    branch: String,
    /// Per-fork agent timeout in seconds.
    #[arg(short, long, default_value_t = 600)]
    timeout: u32,
    /// Idempotency key: launching again with the same id returns the same run.
    #[arg(long, default_value = "")]
    request_id: String,
    /// Wait for the run to finish and print its forks.
    #[arg(long)]
    wait: bool,
}

async fn connect(endpoint: &str) -> anyhow::Result<GatewayClient<Channel>> {
    let channel = tonic::transport::Endpoint::from_shared(endpoint.to_owned())
        .map_err(|e| anyhow::anyhow!("--gateway {endpoint:?}: {e}"))?
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .map_err(|e| {
            anyhow::anyhow!(
                "cannot reach the gateway at {endpoint}: {e} (is the stack up? `make up`)"
            )
        })?;
    Ok(GatewayClient::new(channel).max_decoding_message_size(64 << 20))
}

fn status_error(s: tonic::Status) -> anyhow::Error {
    anyhow::anyhow!("{}: {}", s.code().description(), s.message())
}

fn exit_for(run: &Run) -> ExitCode {
    match RunState::try_from(run.state).unwrap_or_default() {
        RunState::Completed if run.forks_succeeded as usize == run.forks.len() => ExitCode::SUCCESS,
        RunState::Completed | RunState::Running => ExitCode::from(2),
        _ => ExitCode::from(3),
    }
}

fn print_run(run: &Run, output: Output) -> anyhow::Result<()> {
    match output {
        Output::Json => println!("{}", serde_json::to_string_pretty(run)?),
        Output::Table => print!("{}", table::run(run)),
    }
    Ok(())
}

async fn wait_for(client: &mut GatewayClient<Channel>, run_id: &str) -> anyhow::Result<Run> {
    let mut last = String::new();
    loop {
        let run = client
            .get_run(GetRunRequest {
                run_id: run_id.to_owned(),
                include_patches: false,
            })
            .await
            .map_err(status_error)?
            .into_inner();
        if run.state != RunState::Running as i32 {
            return Ok(run);
        }
        let line = format!(
            "{run_id}: {} running, {} succeeded, {} failed of {}",
            run.forks_running,
            run.forks_succeeded,
            run.forks_failed,
            run.forks.len()
        );
        if line != last {
            eprintln!("{line}");
            last = line;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let mut client = connect(&cli.gateway).await?;
    match cli.command {
        Command::Fork(a) => {
            // A local path is sent absolute: the gateway does not share our working directory.
            let repo = match std::fs::canonicalize(&a.repo) {
                Ok(p) if !a.repo.contains("://") => p.to_string_lossy().into_owned(),
                _ => a.repo.clone(),
            };
            let req = LaunchRunRequest {
                request_id: a.request_id,
                repo,
                branch: a.branch,
                prompt: a.prompt,
                forks: a.forks,
                max_concurrent: a.max_concurrent,
                budget_usd: a.budget,
                agent: Some(AgentSpec {
                    driver: "command".into(),
                    command: a.agent_command,
                    model: String::new(),
                }),
                fork_timeout_secs: a.timeout,
                ..Default::default()
            };
            let launched = client
                .launch_run(req)
                .await
                .map_err(status_error)?
                .into_inner();
            let verb = if launched.created {
                "launched"
            } else {
                "already launched"
            };
            eprintln!("{verb} {}", launched.run_id);
            if !a.wait {
                println!("{}", launched.run_id);
                return Ok(ExitCode::SUCCESS);
            }
            let run = wait_for(&mut client, &launched.run_id).await?;
            print_run(&run, cli.output)?;
            Ok(exit_for(&run))
        }
        Command::Status { run_id } => {
            let run = client
                .get_run(GetRunRequest {
                    run_id,
                    include_patches: false,
                })
                .await
                .map_err(status_error)?
                .into_inner();
            print_run(&run, cli.output)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::List { limit } => {
            let resp = client
                .list_runs(ListRunsRequest {
                    page_size: limit,
                    page_token: String::new(),
                })
                .await
                .map_err(status_error)?
                .into_inner();
            match cli.output {
                Output::Json => println!("{}", serde_json::to_string_pretty(&resp)?),
                Output::Table => print!("{}", table::runs(&resp.runs)),
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Cancel { run_id, reason } => {
            client
                .cancel_run(CancelRunRequest {
                    run_id: run_id.clone(),
                    reason,
                })
                .await
                .map_err(status_error)?;
            eprintln!("cancel requested for {run_id}");
            Ok(ExitCode::SUCCESS)
        }
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
