//! The agent spec of a `LaunchRun` request.

use super::fields::{command_size, field, no_nul};
use crate::error::GatewayError;
use forkyard_proto::{Driver, common::v1::AgentSpec};

/// Most entries of `agent.allowed_models`.
const MAX_ALLOWED_MODELS: usize = 32;

pub(super) fn check_agent(agent: Option<&AgentSpec>) -> Result<AgentSpec, GatewayError> {
    let agent = agent.cloned().unwrap_or_default();
    // Whether the runner can run it (its model alias, its API key) is asked of the runner
    // at launch (`api::agent_runner`).
    let Some(driver) = Driver::parse(&agent.driver) else {
        return Err(field(
            "agent.driver",
            format!(
                "unknown driver {:?}; available: {}",
                agent.driver,
                Driver::names()
            ),
        ));
    };
    if driver == Driver::Command && agent.command.trim().is_empty() {
        return Err(field(
            "agent.command",
            "is empty; the command driver needs a shell command to run",
        ));
    }
    command_size("agent.command", &agent.command)?;
    no_nul("agent.command", &agent.command)?;
    // Empty: the driver's default model.
    if !agent.model.is_empty() {
        model_name("agent.model", &agent.model)?;
    }
    check_allowed_models(&agent.allowed_models)?;
    Ok(AgentSpec {
        driver: driver.name().to_owned(),
        ..agent
    })
}

fn check_allowed_models(models: &[String]) -> Result<(), GatewayError> {
    if models.len() > MAX_ALLOWED_MODELS {
        return Err(field(
            "agent.allowed_models",
            format!("{} models; the limit is {MAX_ALLOWED_MODELS}", models.len()),
        ));
    }
    for m in models {
        model_name("agent.allowed_models", m)?;
    }
    Ok(())
}

/// A model's name or alias: at most 200 characters, none of them whitespace or control.
/// It reaches an agent CLI's command line and environment, the LLM gateway's checks and
/// the logs, where a newline would start a line of its own choosing.
fn model_name(name: &str, model: &str) -> Result<(), GatewayError> {
    let ok = !model.is_empty()
        && model.len() <= 200
        && !model.chars().any(|c| c.is_control() || c.is_whitespace());
    if ok {
        Ok(())
    } else {
        Err(field(name, format!("{model:?} is not a model name")))
    }
}

/// Why the run's driver cannot continue a fork, if it cannot: every driver can now
/// (`command` gets the workspace and the parent's names, `claude-code` and `codex` resume
/// the CLI's session, `anthropic` and `openai` the conversation their loop kept in the
/// workspace); an unknown one cannot. Only ever relaxed: the update handler checks it
/// again, so a driver refused here before has no accepted branch in any history.
pub fn driver_refusal(driver: &str) -> Option<String> {
    match Driver::parse(driver) {
        Some(_) => None,
        None => Some(format!("agent.driver: {driver:?} is no driver")),
    }
}
