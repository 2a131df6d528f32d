//! How answers are printed (JSON, YAML or a table), and the exit code a run maps to.

use crate::table;
use clap::ValueEnum;
use forkyard_proto::gateway::v1::{Run, RunState};
use std::process::ExitCode;

/// How read commands print their answers (`-o`, `FORKYARD_OUTPUT`, a context's).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Output {
    Table,
    Json,
    Yaml,
}

/// `print!` to standard output; a closed standard output (`forkyard list | head`) ends
/// the CLI quietly with status 0, as `gh` and `kubectl` do, where `print!` panics.
macro_rules! out {
    ($($arg:tt)*) => { $crate::output::write_out(format_args!($($arg)*)) };
}

/// `println!` as [`out!`] does it.
macro_rules! outln {
    ($($arg:tt)*) => { $crate::output::write_out(format_args!("{}\n", format_args!($($arg)*))) };
}

pub(crate) use {out, outln};

/// Write `args` to standard output and flush: the reader that went away ends the
/// process with status 0; any other failure to write is an error (status 1).
pub fn write_out(args: std::fmt::Arguments<'_>) {
    use std::io::Write as _;
    let mut stdout = std::io::stdout().lock();
    if let Err(e) = stdout.write_fmt(args).and_then(|()| stdout.flush()) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("error: cannot write to standard output: {e}");
        std::process::exit(1);
    }
}

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

/// The `--jq` expression every JSON answer goes through, once the command line said it.
/// Set once in `main`: every command prints JSON through [`print_json_text`], so the
/// filter is not threaded through each of them.
static JQ: std::sync::OnceLock<String> = std::sync::OnceLock::new();

pub fn set_jq(code: String) {
    let _ = JQ.set(code);
}

/// A JSON document printed, or the `--jq` filter's results of it.
fn print_json_text(json: &str) -> anyhow::Result<()> {
    match JQ.get() {
        Some(code) => out!("{}", crate::jq::apply(code, json)?),
        None => outln!("{json}"),
    }
    Ok(())
}

pub fn print_json<M: prost::Message>(message: &M, full_name: &str) -> anyhow::Result<()> {
    print_json_text(&crate::json::to_string(message, full_name)?)
}

pub fn print_yaml<M: prost::Message>(message: &M, full_name: &str) -> anyhow::Result<()> {
    out!("{}", crate::json::to_yaml(message, full_name)?);
    Ok(())
}

/// A value that is not a protobuf message (keys, contexts) as JSON or YAML.
pub fn print_value<T: serde::Serialize>(value: &T, output: Output) -> anyhow::Result<()> {
    match output {
        Output::Yaml => out!("{}", crate::json::value_to_yaml(value)?),
        Output::Json | Output::Table => print_json_text(&serde_json::to_string_pretty(value)?)?,
    }
    Ok(())
}

pub fn print_run(run: &Run, output: Output) -> anyhow::Result<()> {
    match output {
        Output::Json => print_json(run, "forkyard.gateway.v1.Run"),
        Output::Yaml => print_yaml(run, "forkyard.gateway.v1.Run"),
        Output::Table => {
            out!("{}", table::run(run));
            Ok(())
        }
    }
}
