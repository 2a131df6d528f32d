//! `forkyard branch` and `forkyard continue` (fork trees): a fork (finished, or running:
//! at its last completed model turn) branched into
//! new forks of its run through BranchFork; with --wait, until those forks are done.

use crate::{
    client::{Client, status_error},
    output::{Output, print_run},
};
use forkyard_proto::{
    common::v1::ForkStatus,
    gateway::v1::{BranchForkRequest, GetRunRequest, Run},
};
use std::{process::ExitCode, time::Duration};

pub async fn branch(
    client: &mut Client,
    run_id: String,
    fork: u32,
    count: u32,
    prompt: String,
    wait: bool,
    output: Output,
) -> anyhow::Result<ExitCode> {
    let resp = client
        .branch_fork(BranchForkRequest {
            run_id: run_id.clone(),
            fork,
            count,
            prompt,
        })
        .await
        .map_err(status_error)?
        .into_inner();
    let names: Vec<String> = resp.forks.iter().map(u32::to_string).collect();
    eprintln!(
        "fork {fork} of {run_id} branched: new forks {}",
        names.join(", ")
    );
    if !wait {
        if output != Output::Table {
            print_run(&get(client, &run_id).await?, output)?;
        }
        return Ok(ExitCode::SUCCESS);
    }
    let run = until_done(client, &run_id, &resp.forks).await?;
    print_run(&run, output)?;
    let succeeded = resp.forks.iter().all(|n| {
        run.forks
            .get((*n as usize).wrapping_sub(1))
            .is_some_and(|f| f.status == ForkStatus::Succeeded as i32)
    });
    Ok(if succeeded {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
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

/// The run once each of `forks` has ended.
async fn until_done(client: &mut Client, run_id: &str, forks: &[u32]) -> anyhow::Result<Run> {
    let open = [ForkStatus::Pending as i32, ForkStatus::Running as i32];
    loop {
        let run = get(client, run_id).await?;
        let done = forks.iter().all(|n| {
            run.forks
                .get((*n as usize).wrapping_sub(1))
                .is_some_and(|f| !open.contains(&f.status))
        });
        if done {
            return Ok(run);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
