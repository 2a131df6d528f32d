//! `forkyard`: the command line for the gateway API.
//!
//! Exit codes scripts can rely on:
//! - 0: success (for `fork --wait` and `watch`: the run completed and every fork succeeded);
//! - 1: an error (bad input, gateway unreachable, run not found);
//! - 2: the run completed but some fork did not succeed;
//! - 3: the run was cancelled, failed, terminated or timed out;
//! - 64: bad command-line usage.

mod apply;
mod branch;
mod cli;
mod client;
mod commands;
mod complete;
mod config;
mod config_cmd;
mod fork;
mod fork_args;
mod jq;
mod json;
mod keys;
mod live;
mod output;
mod table;
mod watch;
mod when;

use clap::{ArgMatches, CommandFactory as _, FromArgMatches as _, parser::ValueSource};
use std::process::ExitCode;

fn main() -> ExitCode {
    // A shell asking for completions (COMPLETE=bash …) is answered here, and the
    // process ends; before the runtime, as a run id's completer starts its own.
    clap_complete::CompleteEnv::with_factory(cli::Cli::command).complete();
    let (args, typed) = match parse() {
        Ok(parsed) => parsed,
        Err(e) => {
            let code = if e.use_stderr() { 64 } else { 0 };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(commands::run(args, typed)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The command line, and which settings were typed on it (not taken from the
/// environment): `config set-context` stores only those, and `--jq` refuses a typed
/// `-o` other than json.
fn parse() -> Result<(cli::Cli, config_cmd::Typed), clap::Error> {
    let matches = cli::Cli::command().try_get_matches()?;
    let args = cli::Cli::from_arg_matches(&matches)?;
    let typed = config_cmd::Typed {
        gateway: typed_value(&matches, "gateway"),
        api_key: typed_value(&matches, "api_key"),
        gateway_ca: typed_value(&matches, "gateway_ca"),
    };
    let output: Option<output::Output> = typed_value(&matches, "output");
    if args.jq.is_some() && output.is_some_and(|o| o != output::Output::Json) {
        return Err(cli::Cli::command().error(
            clap::error::ErrorKind::ArgumentConflict,
            "--jq filters JSON: it does not go with -o table or -o yaml",
        ));
    }
    Ok((args, typed))
}

/// A global flag's value when it was typed on the command line, before or after the
/// subcommand (clap keeps it on the deepest command that took it).
fn typed_value<T: Clone + Send + Sync + 'static>(matches: &ArgMatches, id: &str) -> Option<T> {
    let mut m = matches;
    let mut found = None;
    loop {
        if m.value_source(id) == Some(ValueSource::CommandLine) {
            found = m.get_one::<T>(id).cloned();
        }
        match m.subcommand() {
            Some((_, sub)) => m = sub,
            None => return found,
        }
    }
}
