//! `forkyard`: the command line for the gateway API.
//!
//! Exit codes scripts can rely on:
//! - 0: success (for `fork --wait` and `watch`: the run completed and every fork succeeded);
//! - 1: an error (bad input, gateway unreachable, run not found);
//! - 2: the run completed but some fork did not succeed;
//! - 3: the run was cancelled, failed, terminated or timed out;
//! - 64: bad command-line usage.

mod cli;
mod client;
mod commands;
mod fork;
mod json;
mod keys;
mod live;
mod output;
mod table;
mod watch;
mod when;

use clap::Parser;
use std::process::ExitCode;

#[tokio::main]
async fn main() -> ExitCode {
    let args = match cli::Cli::try_parse() {
        Ok(a) => a,
        Err(e) => {
            let code = if e.use_stderr() { 64 } else { 0 };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    match commands::run(args).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
