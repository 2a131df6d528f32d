//! The e2e tests' scripted model server (`forkyard_tests::scripted_model`) as a program,
//! for the container tests: the agent runner's ANTHROPIC_BASE_URL / OPENAI_BASE_URL in
//! another container point at it.
//!
//!   scripted-model --listen 0.0.0.0:8080 --command 'bash probe.sh'
//!
//! Until a conversation holds a tool result (`--calls` of them) the model asks for
//! `--command` (Claude Code's `Bash` tool, Codex's `exec_command`); then it answers
//! "done". `--delay-ms` makes it a slow model. Every request is printed
//! as one JSON line on standard output: method, path, the model asked for, and which
//! credential header it carried (`x-api-key` / `authorization`, the value's first 12
//! characters only).

use clap::Parser;
use forkyard_tests::scripted_model::{Script, ScriptedModel};
use serde_json::json;
use std::{io::Write, time::Duration};

#[derive(Parser)]
#[command(about = "A scripted model server (Anthropic Messages, OpenAI Responses and Chat)")]
struct Args {
    /// Address to listen on.
    #[arg(long, default_value = "0.0.0.0:8080")]
    listen: String,
    /// The shell command the model asks the agent to run.
    #[arg(long)]
    command: String,
    /// Ask for the command until the conversation holds this many tool results.
    #[arg(long, default_value_t = 1)]
    calls: usize,
    /// Wait this long before answering each model call (a slow model).
    #[arg(long, default_value_t = 0)]
    delay_ms: u64,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let script = Script {
        calls: args.calls,
        delay: Duration::from_millis(args.delay_ms),
        ..Script::edit(&args.command)
    };
    let model = ScriptedModel::start_on(&args.listen, script).await?;
    eprintln!("scripted-model: listening on {}", model.url);
    let mut printed = 0;
    loop {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => return Ok(()),
            _ = tokio::time::sleep(Duration::from_millis(200)) => {}
        }
        let recorded = model.recorded();
        let mut out = std::io::stdout().lock();
        for r in &recorded[printed..] {
            let key = |name: &str| {
                r.header(name)
                    .map(|v| v.chars().take(12).collect::<String>())
            };
            let line = json!({
                "method": r.method,
                "path": r.path,
                "model": r.body.get("model"),
                "x-api-key": key("x-api-key"),
                "authorization": key("authorization"),
            });
            writeln!(out, "{line}")?;
        }
        out.flush()?;
        printed = recorded.len();
    }
}
