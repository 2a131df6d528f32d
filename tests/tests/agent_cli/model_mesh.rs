//! The agent runner's keys and model endpoints, a launch of a driver's forks, and what a
//! model call costs.

use forkyard_proto::{common::v1::AgentSpec, gateway::v1::LaunchRunRequest};
use forkyard_tests::{
    mesh::MeshOptions,
    scripted_model::{CACHED_TOKENS, INPUT_TOKENS, OUTPUT_TOKENS, ScriptedModel},
};
use std::path::Path;

pub const ANTHROPIC_KEY: &str = "sk-ant-api03-e2eREALKEY-4c1d9";
pub const OPENAI_KEY: &str = "sk-proj-e2eREALKEY-77b0e";
/// Every fork token starts so (`llm_gateway::grants`).
pub const TOKEN_PREFIX: &str = "fyk-llm-";

/// A mesh whose agent runner holds the real keys and reaches `model` as both providers.
pub fn options(model: &ScriptedModel) -> MeshOptions {
    let runner = |k: &str, v: &str| ("agent-runner".to_owned(), k.to_owned(), v.to_owned());
    MeshOptions {
        service_env: vec![
            runner("ANTHROPIC_BASE_URL", &model.url),
            runner("ANTHROPIC_API_KEY", ANTHROPIC_KEY),
            runner("OPENAI_BASE_URL", &format!("{}/v1", model.url)),
            runner("OPENAI_API_KEY", OPENAI_KEY),
        ],
        ..Default::default()
    }
}

/// `forks` forks of `driver` with `model`, all at once, on a budget of `budget` dollars.
pub fn launch(
    repo: &Path,
    driver: &str,
    model: &str,
    forks: u32,
    budget: &str,
) -> LaunchRunRequest {
    LaunchRunRequest {
        repo: repo.to_string_lossy().into_owned(),
        prompt: "Add a line to notes.txt".into(),
        forks,
        max_concurrent: forks,
        budget_usd: budget.into(),
        agent: Some(AgentSpec {
            driver: driver.into(),
            model: model.into(),
            ..Default::default()
        }),
        fork_timeout_secs: 180,
        ..Default::default()
    }
}

/// The pinned CLI in the project's npm prefix (`make deps-agents`), which the mesh binds
/// into its sandboxes: the one the tests run, whatever else the host has installed.
pub fn assert_cli_installed(cli: &str) {
    let found = cli_path(cli).is_some_and(|p| {
        std::process::Command::new(p)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    });
    assert!(
        found,
        "the {cli} CLI is not in the agent tools ({:?}): `make deps-agents` installs it (npm, the project's own prefix)",
        forkyard_tests::mesh::agent_tools()
    );
}

/// `<agent tools>/bin/<cli>`.
pub fn cli_path(cli: &str) -> Option<std::path::PathBuf> {
    forkyard_tests::mesh::agent_tools().map(|d| d.join("bin").join(cli))
}

/// Per model call, micro-USD: the scripted usage priced from the runner's table.
pub fn price_per_call(input: f64, output: f64, cache_read: f64) -> i64 {
    let micro = (INPUT_TOKENS - CACHED_TOKENS) as f64 * input
        + OUTPUT_TOKENS as f64 * output
        + CACHED_TOKENS as f64 * cache_read;
    (micro - 1e-6).ceil() as i64
}
