//! The e2e tests' scripted model server (`forkyard_tests::scripted_model`) as a program,
//! for the container tests: the agent runner's ANTHROPIC_BASE_URL / OPENAI_BASE_URL in
//! another container point at it.
//!
//!   scripted-model --listen 0.0.0.0:8080 --command 'bash probe.sh'
//!
//! Until a conversation holds a tool result the model asks for `--command` (Claude Code's
//! `Bash` tool, Codex's `exec_command`); then it answers "done". Every request is printed
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
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let model = ScriptedModel::start_on(&args.listen, Script::edit(&args.command)).await?;
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
