//! What each subcommand does against the gateway.

use crate::{
    cli::{BudgetCommand, Cli, Command, ForkArgs, Output},
    client::{Client, connect, status_error},
    table, watch,
};
use forkyard_proto::{
    common::v1::AgentSpec,
    gateway::v1::{
        CancelForkRequest, CancelRunRequest, GetForkResultRequest, GetRunRequest, LaunchRunRequest,
        ListRunsRequest, ListRunsResponse, PauseRunRequest, RaiseBudgetRequest, ResumeRunRequest,
        Run, RunState, StartCleanupRequest, StopCleanupRequest,
    },
};
use std::process::ExitCode;

/// The exit code a finished run maps to (see the crate docs).
pub fn exit_for(run: &Run) -> ExitCode {
    match RunState::try_from(run.state).unwrap_or_default() {
        RunState::Completed if run.forks_succeeded as usize == run.forks.len() => ExitCode::SUCCESS,
        RunState::Completed | RunState::Running | RunState::Paused | RunState::AwaitingBudget => {
            ExitCode::from(2)
        }
        _ => ExitCode::from(3),
    }
}

fn print_json<M: prost::Message>(message: &M, full_name: &str) -> anyhow::Result<()> {
    println!("{}", crate::json::to_string(message, full_name)?);
    Ok(())
}

fn print_yaml<M: prost::Message>(message: &M, full_name: &str) -> anyhow::Result<()> {
    print!("{}", crate::json::to_yaml(message, full_name)?);
    Ok(())
}

fn print_run(run: &Run, output: Output) -> anyhow::Result<()> {
    match output {
        Output::Json => print_json(run, "forkyard.gateway.v1.Run"),
        Output::Yaml => print_yaml(run, "forkyard.gateway.v1.Run"),
        Output::Table => {
            print!("{}", table::run(run));
            Ok(())
        }
    }
}

fn parse_state(s: &str) -> anyhow::Result<RunState> {
    let name = format!(
        "RUN_STATE_{}",
        s.trim().to_ascii_uppercase().replace('-', "_")
    );
    RunState::from_str_name(&name)
        .ok_or_else(|| anyhow::anyhow!("--state {s:?} is not a run state"))
}

async fn get(client: &mut Client, run_id: &str) -> anyhow::Result<Run> {
    Ok(client
        .get_run(GetRunRequest {
            run_id: run_id.to_owned(),
        })
        .await
        .map_err(status_error)?
        .into_inner())
}

async fn fork(client: &mut Client, a: ForkArgs, output: Output) -> anyhow::Result<ExitCode> {
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
        fork_budget_usd: a.fork_budget.unwrap_or_default(),
        agent: Some(AgentSpec {
            driver: a.driver.unwrap_or_else(|| {
                if a.agent_command.is_some() {
                    "command".into()
                } else {
                    "claude-code".into()
                }
            }),
            command: a.agent_command.unwrap_or_default(),
            model: a.model,
            max_turns: a.max_turns,
            allowed_models: a.allowed_models,
        }),
        egress: a.egress,
        image: a.image,
        fork_timeout_secs: a.timeout,
        verify_command: a.verify.unwrap_or_default(),
        stop_on_first_verified: a.stop_on_first_verified,
        labels: a.labels.into_iter().collect(),
        ..Default::default()
    };
    let launched = client
        .launch_run(req)
        .await
        .map_err(status_error)?
        .into_inner();
    if !a.wait {
        match output {
            Output::Json => print_json(&launched, "forkyard.gateway.v1.LaunchRunResponse")?,
            Output::Yaml => print_yaml(&launched, "forkyard.gateway.v1.LaunchRunResponse")?,
            Output::Table => println!("{}", launched.run_id),
        }
        return Ok(ExitCode::SUCCESS);
    }
    let verb = if launched.created {
        "launched"
    } else {
        "already launched"
    };
    eprintln!("{verb} {}", launched.run_id);
    let run = watch::follow(client, &launched.run_id, output == Output::Table).await?;
    print_run(&run, output)?;
    Ok(exit_for(&run))
}

pub async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let command = match cli.command {
        // Keys live in the gateway's key file, not behind its API.
        Command::Keys(k) => return crate::keys::run(k, cli.output).await,
        // Needs no gateway either.
        Command::Completion { shell } => {
            let mut cmd = <Cli as clap::CommandFactory>::command();
            clap_complete::generate(shell, &mut cmd, "forkyard", &mut std::io::stdout());
            return Ok(ExitCode::SUCCESS);
        }
        other => other,
    };
    let mut client = connect(
        &cli.gateway,
        cli.api_key.as_deref(),
        cli.gateway_ca.as_deref(),
    )
    .await?;
    let output = cli.output;
    match command {
        Command::Fork(a) => fork(&mut client, *a, output).await,
        Command::Status { run_id } => {
            print_run(&get(&mut client, &run_id).await?, output)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Watch { run_id } => {
            let run = watch::follow(&mut client, &run_id, output == Output::Table).await?;
            print_run(&run, output)?;
            Ok(exit_for(&run))
        }
        Command::List {
            limit,
            state,
            labels,
        } => {
            let state = state
                .as_deref()
                .map(parse_state)
                .transpose()?
                .unwrap_or_default();
            // Page by page (the gateway's pages are at most its own size) until `limit`
            // runs or the last page.
            let mut resp = ListRunsResponse::default();
            loop {
                let want = limit.saturating_sub(resp.runs.len() as u32);
                if want == 0 {
                    break;
                }
                let page = client
                    .list_runs(ListRunsRequest {
                        page_size: want,
                        page_token: std::mem::take(&mut resp.next_page_token),
                        state: state as i32,
                        labels: labels.iter().cloned().collect(),
                    })
                    .await
                    .map_err(status_error)?
                    .into_inner();
                let empty = page.runs.is_empty();
                resp.runs.extend(page.runs);
                resp.next_page_token = page.next_page_token;
                if empty || resp.next_page_token.is_empty() {
                    break;
                }
            }
            resp.runs.truncate(limit as usize);
            match output {
                Output::Json => print_json(&resp, "forkyard.gateway.v1.ListRunsResponse")?,
                Output::Yaml => print_yaml(&resp, "forkyard.gateway.v1.ListRunsResponse")?,
                Output::Table => print!("{}", table::runs(&resp.runs)),
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Cancel {
            run_id,
            fork: Some(fork),
            reason,
        } => {
            client
                .cancel_fork(CancelForkRequest {
                    run_id: run_id.clone(),
                    fork,
                    reason,
                })
                .await
                .map_err(status_error)?;
            eprintln!("cancel requested for fork {fork} of {run_id}");
            Ok(ExitCode::SUCCESS)
        }
        Command::Cancel {
            run_id,
            fork: None,
            reason,
        } => {
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
        Command::Pause { run_id } => {
            let run = client
                .pause_run(PauseRunRequest { run_id })
                .await
                .map_err(status_error)?
                .into_inner();
            print_run(&run, output)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Resume { run_id } => {
            let run = client
                .resume_run(ResumeRunRequest { run_id })
                .await
                .map_err(status_error)?
                .into_inner();
            print_run(&run, output)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Budget {
            command: BudgetCommand::Raise { run_id, amount },
        } => {
            let resp = client
                .raise_budget(RaiseBudgetRequest {
                    run_id: run_id.clone(),
                    amount_usd: amount,
                })
                .await
                .map_err(status_error)?
                .into_inner();
            match output {
                Output::Json => print_json(&resp, "forkyard.gateway.v1.RaiseBudgetResponse")?,
                Output::Yaml => print_yaml(&resp, "forkyard.gateway.v1.RaiseBudgetResponse")?,
                Output::Table => println!(
                    "{run_id}: budget {} ({} available)",
                    table::usd(resp.budget_micros),
                    table::usd(resp.available_micros)
                ),
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Result { run_id, fork, save } => {
            let f = client
                .get_fork_result(GetForkResultRequest { run_id, fork })
                .await
                .map_err(status_error)?
                .into_inner();
            if let Some(path) = save {
                std::fs::write(&path, &f.patch)
                    .map_err(|e| anyhow::anyhow!("--save {}: {e}", path.display()))?;
                eprintln!(
                    "patch of fork {fork} ({} bytes) written to {}",
                    f.patch.len(),
                    path.display()
                );
            } else {
                match output {
                    Output::Json => print_json(&f, "forkyard.common.v1.ForkResult")?,
                    Output::Yaml => print_yaml(&f, "forkyard.common.v1.ForkResult")?,
                    Output::Table => print!("{}", table::fork(&f)),
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Cleanup { interval, max_age } => {
            let resp = client
                .start_cleanup(StartCleanupRequest {
                    interval_minutes: interval,
                    max_age_minutes: max_age,
                })
                .await
                .map_err(status_error)?
                .into_inner();
            let verb = if resp.created { "created" } else { "updated" };
            eprintln!(
                "cleanup schedule {} {verb}: every {interval} min, max age {max_age} min",
                resp.schedule_id
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::StopCleanup => {
            client
                .stop_cleanup(StopCleanupRequest {})
                .await
                .map_err(status_error)?;
            eprintln!("cleanup schedule removed");
            Ok(ExitCode::SUCCESS)
        }
        Command::Keys(k) => crate::keys::run(k, output).await,
        Command::Completion { .. } => unreachable!("answered before connecting"),
    }
}
