//! What each subcommand does against the gateway: `run` connects and hands each
//! subcommand to its function.

use crate::output::{out, outln};
use crate::{
    cli::{BudgetCommand, Cli, Command},
    client::{Client, connect, status_error},
    config::{self, Settings},
    config_cmd::{self, Typed},
    output::Output,
    output::{exit_for, print_json, print_run, print_yaml},
    table, watch,
};
use forkyard_proto::gateway::v1::{
    CancelForkRequest, CancelRunRequest, GetForkResultRequest, GetRunRequest, ListRunsRequest,
    ListRunsResponse, PauseRunRequest, PublishForkRequest, RaiseBudgetRequest, ResumeRunRequest,
    Run, RunState, StartCleanupRequest, StopCleanupRequest,
};
use std::{path::PathBuf, process::ExitCode};

pub async fn run(mut cli: Cli, typed: Typed) -> anyhow::Result<ExitCode> {
    if let Some(code) = &cli.jq {
        crate::output::set_jq(code.clone());
    }
    // What needs no gateway prints as typed, without the context (which may be the
    // broken thing `config` is mending).
    let local_output = if cli.jq.is_some() {
        Output::Json
    } else {
        cli.output.unwrap_or(Output::Table)
    };
    let command = match std::mem::replace(&mut cli.command, Command::StopCleanup) {
        // Through the gateway's admin API with a key; on the store itself to make the
        // first one.
        Command::Keys(k) => {
            if k.local || k.keys_db.is_some() || k.keys_url.is_some() {
                return crate::keys::run(k, local_output).await;
            }
            let settings =
                Settings::resolve(&cli.flags(), config::selected(cli.context.as_deref())?);
            let Some(key) = settings.key.get(true)? else {
                return crate::keys::run(k, local_output).await;
            };
            let channel = crate::client::channel(&settings.gateway, settings.gateway_ca.as_deref());
            let client = crate::keys::api_client(channel.await?, &key)?;
            return crate::keys::remote(client, k.command, settings.output).await;
        }
        Command::Completion { shell } => return completion(shell),
        Command::Config { command } => return config_cmd::run(command, typed, local_output),
        // A prompt file that is not there costs no call.
        Command::Fork(mut a) => {
            a.prompt = crate::fork::read_prompt(&a.prompt)?;
            Command::Fork(a)
        }
        other => other,
    };
    let settings = Settings::resolve(&cli.flags(), config::selected(cli.context.as_deref())?);
    let key = settings.key.get(true)?;
    let mut client = connect(
        &settings.gateway,
        key.as_deref(),
        settings.gateway_ca.as_deref(),
    )
    .await?;
    call(&mut client, command, settings.output).await
}

/// A command that calls the gateway, on `client`.
async fn call(client: &mut Client, command: Command, output: Output) -> anyhow::Result<ExitCode> {
    match command {
        Command::Fork(a) => crate::fork::launch(client, *a, output).await,
        Command::Status { run_id } => status(client, &run_id, output).await,
        Command::Watch { run_id } => watch_run(client, &run_id, output).await,
        Command::List {
            limit,
            state,
            labels,
            tenant,
        } => {
            let filter = (state.as_deref(), labels, tenant.unwrap_or_default());
            list(client, limit, filter, output).await
        }
        Command::Cancel {
            run_id,
            fork: Some(fork),
            reason,
        } => cancel_fork(client, run_id, fork, reason).await,
        Command::Cancel { run_id, reason, .. } => cancel_run(client, run_id, reason).await,
        Command::Pause { run_id } => pause(client, run_id, output).await,
        Command::Resume { run_id } => resume(client, run_id, output).await,
        Command::Budget {
            command: BudgetCommand::Raise { run_id, amount },
        } => raise_budget(client, run_id, amount, output).await,
        Command::Result {
            run_id, fork, save, ..
        } => result(client, run_id, fork, save, output).await,
        Command::Apply {
            run_id,
            fork,
            force,
        } => crate::apply::apply(client, run_id, fork, force).await,
        Command::Publish {
            run_id,
            fork,
            pr,
            draft,
            branch,
            author,
        } => {
            let (author_name, author_email) = author.unwrap_or_default();
            let to = (branch, author_name, author_email);
            publish(client, publish_request(run_id, fork, pr, draft, to), output).await
        }
        Command::Branch {
            run_id,
            fork,
            count,
            prompt,
            wait,
        } => crate::branch::branch(client, run_id, fork, count, prompt, wait, output).await,
        Command::Continue {
            run_id,
            fork,
            prompt,
            wait,
        } => crate::branch::branch(client, run_id, fork, 1, prompt, wait, output).await,
        Command::Cleanup { interval, max_age } => cleanup(client, interval, max_age).await,
        Command::StopCleanup => stop_cleanup(client).await,
        Command::Keys(_) | Command::Completion { .. } | Command::Config { .. } => {
            unreachable!("answered before connecting")
        }
    }
}

/// `publish`'s request: fork `fork` of `run_id`, with a pull request if `pr` (a draft
/// if `draft`), on `<branch>-fork-<n>` by the author given (both empty: the defaults).
fn publish_request(
    run_id: String,
    fork: u32,
    pr: bool,
    draft: bool,
    (branch_prefix, author_name, author_email): (String, String, String),
) -> PublishForkRequest {
    PublishForkRequest {
        run_id,
        fork,
        pull_request: pr,
        draft,
        branch_prefix,
        author_name,
        author_email,
        ..Default::default()
    }
}

/// One fork's result (the winner's when no fork is named), its patch saved if asked.
async fn result(
    client: &mut Client,
    run_id: String,
    fork: Option<u32>,
    save: Option<std::path::PathBuf>,
    output: Output,
) -> anyhow::Result<ExitCode> {
    let fork = match fork {
        Some(f) => f,
        None => crate::apply::winner(client, &run_id).await?,
    };
    fork_result(client, GetForkResultRequest { run_id, fork }, save, output).await
}

/// The dynamic completion's registration script (see `complete`).
fn completion(shell: clap_complete::Shell) -> anyhow::Result<ExitCode> {
    out!("{}", crate::complete::registration(shell)?);
    Ok(ExitCode::SUCCESS)
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

async fn status(client: &mut Client, run_id: &str, output: Output) -> anyhow::Result<ExitCode> {
    print_run(&get(client, run_id).await?, output)?;
    Ok(ExitCode::SUCCESS)
}

async fn watch_run(client: &mut Client, run_id: &str, output: Output) -> anyhow::Result<ExitCode> {
    let run = watch::follow(client, run_id, output == Output::Table).await?;
    print_run(&run, output)?;
    Ok(exit_for(&run))
}

/// `forkyard list`: runs by state, labels and tenant.
async fn list(
    client: &mut Client,
    limit: u32,
    (state, labels, tenant): (Option<&str>, Vec<(String, String)>, String),
    output: Output,
) -> anyhow::Result<ExitCode> {
    let state = state.map(parse_state).transpose()?.unwrap_or_default();
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
                tenant: tenant.clone(),
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
        Output::Table => out!("{}", table::runs(&resp.runs)),
    }
    Ok(ExitCode::SUCCESS)
}

async fn cancel_fork(
    client: &mut Client,
    run_id: String,
    fork: u32,
    reason: String,
) -> anyhow::Result<ExitCode> {
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

async fn cancel_run(
    client: &mut Client,
    run_id: String,
    reason: String,
) -> anyhow::Result<ExitCode> {
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

async fn pause(client: &mut Client, run_id: String, output: Output) -> anyhow::Result<ExitCode> {
    let run = client
        .pause_run(PauseRunRequest { run_id })
        .await
        .map_err(status_error)?
        .into_inner();
    print_run(&run, output)?;
    Ok(ExitCode::SUCCESS)
}

async fn resume(client: &mut Client, run_id: String, output: Output) -> anyhow::Result<ExitCode> {
    let run = client
        .resume_run(ResumeRunRequest { run_id })
        .await
        .map_err(status_error)?
        .into_inner();
    print_run(&run, output)?;
    Ok(ExitCode::SUCCESS)
}

async fn raise_budget(
    client: &mut Client,
    run_id: String,
    amount: String,
    output: Output,
) -> anyhow::Result<ExitCode> {
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
        Output::Table => outln!(
            "{run_id}: budget {} ({} available)",
            table::usd(resp.budget_micros),
            table::usd(resp.available_micros)
        ),
    }
    Ok(ExitCode::SUCCESS)
}

/// The fork printed, or with `--save` its patch written to a file.
async fn fork_result(
    client: &mut Client,
    req: GetForkResultRequest,
    save: Option<PathBuf>,
    output: Output,
) -> anyhow::Result<ExitCode> {
    let fork = req.fork;
    let f = client
        .get_fork_result(req)
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
            Output::Table => out!("{}", table::fork(&f)),
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The fork delivered; exit 1 when it was not pushed (or its pull request not opened).
async fn publish(
    client: &mut Client,
    req: PublishForkRequest,
    output: Output,
) -> anyhow::Result<ExitCode> {
    let f = client
        .publish_fork(req)
        .await
        .map_err(status_error)?
        .into_inner();
    match output {
        Output::Json => print_json(&f, "forkyard.common.v1.ForkResult")?,
        Output::Yaml => print_yaml(&f, "forkyard.common.v1.ForkResult")?,
        Output::Table => outln!("{}", table::delivered_line(&f)),
    }
    let done = f.delivered.as_ref().is_some_and(|d| d.error.is_empty());
    Ok(if done {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

async fn cleanup(client: &mut Client, interval: u32, max_age: u32) -> anyhow::Result<ExitCode> {
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

async fn stop_cleanup(client: &mut Client) -> anyhow::Result<ExitCode> {
    client
        .stop_cleanup(StopCleanupRequest {})
        .await
        .map_err(status_error)?;
    eprintln!("cleanup schedule removed");
    Ok(ExitCode::SUCCESS)
}
