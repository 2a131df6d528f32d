//! The real agent CLIs in forks, through the whole mesh: `claude` (Claude Code) and
//! `codex` run in each fork's sandbox, reach a scripted model server speaking the
//! Anthropic / OpenAI wire protocol only through the agent runner's metering LLM
//! gateway, and carry out the model's tool call. Checked: the edit is in the patch, the
//! ledger holds exactly the priced usage, and the real API key is nowhere but in the
//! request to the model (not in the sandbox's environment, files or processes, the logs,
//! the transcript, or the run's Temporal history). The same on images that bring the
//! CLIs: e2e_agent_cli_images; a model that will not stop or is down: e2e_model_faults.
//!
//! `make test` installs the CLIs (pinned, from npm); without them these tests fail.

mod agent_cli;

use agent_cli::{
    forks::run_cli_forks_on,
    model_mesh::{assert_cli_installed, price_per_call},
};

async fn run_cli_forks(driver: &str, model_name: &str, key_var: &str, per_call: i64, line: &str) {
    run_cli_forks_on(driver, model_name, key_var, per_call, line, None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_code_forks_edit_through_the_gateway_and_pay_exactly_their_usage() {
    assert_cli_installed("claude");
    // claude-sonnet-4-5: $3 in, $15 out, $0.30 cache read per million tokens.
    run_cli_forks(
        "claude-code",
        "sonnet",
        "ANTHROPIC_API_KEY",
        price_per_call(3.0, 15.0, 0.3),
        "edited by claude",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn codex_forks_edit_through_the_gateway_and_pay_exactly_their_usage() {
    assert_cli_installed("codex");
    // gpt-5: $1.25 in, $10 out, $0.125 cached per million tokens.
    run_cli_forks(
        "codex",
        "gpt-5",
        "OPENAI_API_KEY",
        price_per_call(1.25, 10.0, 0.125),
        "edited by codex",
    )
    .await;
}
