//! How answers are printed (JSON, YAML or a table), and the exit code a run maps to.

use crate::{cli::Output, table};
use forkyard_proto::gateway::v1::{Run, RunState};
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

pub fn print_json<M: prost::Message>(message: &M, full_name: &str) -> anyhow::Result<()> {
    println!("{}", crate::json::to_string(message, full_name)?);
    Ok(())
}

pub fn print_yaml<M: prost::Message>(message: &M, full_name: &str) -> anyhow::Result<()> {
    print!("{}", crate::json::to_yaml(message, full_name)?);
    Ok(())
}

pub fn print_run(run: &Run, output: Output) -> anyhow::Result<()> {
    match output {
        Output::Json => print_json(run, "forkyard.gateway.v1.Run"),
        Output::Yaml => print_yaml(run, "forkyard.gateway.v1.Run"),
        Output::Table => {
            print!("{}", table::run(run));
            Ok(())
        }
    }
}
