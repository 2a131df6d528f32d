//! Which drivers this runner can run, with what models and keys. The keys are read from
//! the runner's environment only, held as `Secret`s, and sent nowhere but the model API.

use crate::{
    error::AgentError,
    llm::{Endpoint, Secret, anthropic, http::RetryPolicy, openai},
    models::Models,
};
use forkyard_proto::{Driver, common::v1::AgentSpec, driver::Provider};

pub const DEFAULT_MAX_TURNS: u32 = 50;

#[derive(Debug, Clone)]
pub struct Drivers {
    pub models: Models,
    pub anthropic: Endpoint,
    pub openai: Endpoint,
    pub max_turns: u32,
    pub http: reqwest::Client,
}

/// The driver and model id an agent spec asks for.
#[derive(Debug, Clone, PartialEq)]
pub struct Choice {
    pub driver: String,
    pub model: String,
}

fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

impl Drivers {
    /// From the process environment: `ANTHROPIC_API_KEY`, `ANTHROPIC_BASE_URL`,
    /// `OPENAI_API_KEY`, `OPENAI_BASE_URL`.
    pub fn from_env(models: Models) -> Self {
        let anthropic = Endpoint {
            base_url: var(anthropic::BASE_URL_VAR)
                .unwrap_or_else(|| anthropic::DEFAULT_BASE_URL.to_owned()),
            key: var(anthropic::KEY_VAR).and_then(Secret::new),
            retry: RetryPolicy::default(),
        };
        let openai = Endpoint {
            base_url: var(openai::BASE_URL_VAR)
                .unwrap_or_else(|| openai::DEFAULT_BASE_URL.to_owned()),
            key: var(openai::KEY_VAR).and_then(Secret::new),
            retry: RetryPolicy::default(),
        };
        Self::new(models, anthropic, openai)
    }

    pub fn new(models: Models, anthropic: Endpoint, openai: Endpoint) -> Self {
        let http = reqwest::Client::builder()
            .connect_timeout(std::time::Duration::from_secs(10))
            // A long generation can take minutes; the fork's timeout bounds the loop.
            .timeout(std::time::Duration::from_secs(600))
            .build()
            .expect("reqwest client with rustls");
        Self {
            models,
            anthropic,
            openai,
            max_turns: DEFAULT_MAX_TURNS,
            http,
        }
    }

    /// INVALID_ARGUMENT for an unknown driver or model alias, FAILED_PRECONDITION naming
    /// the variable for a missing key.
    pub fn check(&self, agent: &AgentSpec) -> Result<Choice, AgentError> {
        let bad = |field: &str, m: String| AgentError::InvalidArgument(format!("{field}: {m}"));
        let driver = Driver::parse(&agent.driver).ok_or_else(|| {
            let known = Driver::names();
            bad(
                "agent.driver",
                format!("unknown driver {:?}; available: {known}", agent.driver),
            )
        })?;
        let choice = |model: String| Choice {
            driver: driver.name().into(),
            model,
        };
        let provider = match (driver, driver.capabilities().provider) {
            (Driver::Command, _) => {
                if agent.command.trim().is_empty() {
                    return Err(bad("agent.command", "is empty".into()));
                }
                return Ok(choice(agent.model.clone()));
            }
            (d, Some(p)) if !d.capabilities().in_sandbox => p,
            (d, _) => return Err(bad("agent.driver", format!("{d} is not a model loop"))),
        };
        let model = self
            .models
            .resolve(driver.name(), &agent.model)
            .map_err(|m| bad("agent.model", m))?;
        let missing = match provider {
            Provider::Anthropic => self.anthropic.key.is_none().then_some(anthropic::KEY_VAR),
            // OpenAI itself needs a key; local OpenAI-compatible servers (a custom
            // OPENAI_BASE_URL) usually do not.
            Provider::OpenAi => (self.openai.key.is_none()
                && self.openai.base_url.trim_end_matches('/') == openai::DEFAULT_BASE_URL)
                .then_some(openai::KEY_VAR),
        };
        if let Some(var) = missing {
            return Err(AgentError::MissingKey {
                driver: driver.name().into(),
                var,
            });
        }
        Ok(choice(model))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn endpoint(key: Option<&str>, base: &str) -> Endpoint {
        Endpoint {
            base_url: base.into(),
            key: key.and_then(|k| Secret::new(k.into())),
            retry: RetryPolicy::default(),
        }
    }

    fn spec(driver: &str, model: &str) -> AgentSpec {
        AgentSpec {
            driver: driver.into(),
            model: model.into(),
            ..Default::default()
        }
    }

    #[test]
    fn check_names_the_field_or_the_variable() {
        let none = Drivers::new(
            Models::default(),
            endpoint(None, anthropic::DEFAULT_BASE_URL),
            endpoint(None, openai::DEFAULT_BASE_URL),
        );
        let e = none.check(&spec("anthropic", "sonnet")).unwrap_err();
        assert!(matches!(e, AgentError::MissingKey { .. }));
        assert!(e.to_string().contains("ANTHROPIC_API_KEY"), "{e}");
        assert_eq!(
            tonic::Status::from(e).code(),
            tonic::Code::FailedPrecondition
        );
        let e = none.check(&spec("openai", "gpt-4o")).unwrap_err();
        assert!(e.to_string().contains("OPENAI_API_KEY"), "{e}");
        let e = none.check(&spec("gemini", "")).unwrap_err();
        assert!(e.to_string().starts_with("agent.driver:"), "{e}");
        let e = none.check(&spec("anthropic", "sonet")).unwrap_err();
        assert_eq!(tonic::Status::from(e).code(), tonic::Code::InvalidArgument);

        let keyed = Drivers::new(
            Models::default(),
            endpoint(Some("sk-ant-test"), "http://127.0.0.1:1"),
            endpoint(None, "http://127.0.0.1:11434/v1"),
        );
        assert_eq!(
            keyed.check(&spec("anthropic", "haiku")).unwrap().model,
            "claude-haiku-4-5"
        );
        // A local OpenAI-compatible server needs no key.
        assert_eq!(
            keyed
                .check(&spec("openai", "qwen2.5-coder:7b"))
                .unwrap()
                .driver,
            "openai"
        );
        assert!(!format!("{keyed:?}").contains("sk-ant-test"));
    }
}
