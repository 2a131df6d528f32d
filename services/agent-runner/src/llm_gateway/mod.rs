//! The metering LLM gateway: the only way a fork's agent reaches a model.
//!
//! It lives in the agent runner because the runner already holds what it needs and
//! nothing in a sandbox's host should: the API keys (`ANTHROPIC_API_KEY`,
//! `OPENAI_API_KEY`), the price table, the ledger connection with its idempotent
//! charges, and the lifetime of each agent (a fork's token lives exactly as long as its
//! command). The provisioner only relays bytes from the sandbox's loopback to here,
//! announcing the sandbox in a PROXY v2 header; the provisioner's host, where untrusted
//! code runs, never holds a key.
//!
//! Per request: the fork's token (`x-api-key` or `Authorization: Bearer`) must be live
//! and presented from its own sandbox; the model must be allowed; the real key replaces
//! the token; the response streams back untouched while its usage is read; the usage is
//! priced and charged to the fork's reservation under a key unique to the request. Once
//! the reservation refuses a charge, further requests are refused and the fork's driver
//! stops the agent (`BUDGET_EXCEEDED`).

pub mod grants;
pub mod meter;
mod metrics;
mod proxy;

use crate::{llm::Endpoint, models::Models};
use grants::Grants;
use std::sync::Arc;

pub use proxy::serve;

/// The two providers' upstreams (the real APIs, vLLM, Ollama: the runner's
/// `ANTHROPIC_BASE_URL` / `OPENAI_BASE_URL`) with the keys injected there.
pub struct LlmGateway {
    pub grants: Arc<Grants>,
    pub anthropic: Endpoint,
    pub openai: Endpoint,
    pub models: Models,
    http: reqwest::Client,
    /// What provisioners dial for this replica (`ExecRequest.llm_gateway`).
    pub advertise: String,
}

impl LlmGateway {
    pub fn new(anthropic: Endpoint, openai: Endpoint, models: Models, advertise: String) -> Self {
        let http = reqwest::Client::builder()
            .connect_timeout(std::time::Duration::from_secs(10))
            // Streams run as long as the model generates: no overall timeout (the fork's
            // own timeout ends the agent, and with it the connection).
            .pool_idle_timeout(std::time::Duration::from_secs(60))
            .tcp_nodelay(true)
            .build()
            .expect("reqwest client with rustls");
        Self {
            grants: Arc::new(Grants::default()),
            anthropic,
            openai,
            models,
            http,
            advertise,
        }
    }
}

impl std::fmt::Debug for LlmGateway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LlmGateway")
            .field("advertise", &self.advertise)
            .field("live_grants", &self.grants.live())
            .finish_non_exhaustive()
    }
}
