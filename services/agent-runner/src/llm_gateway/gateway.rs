//! The gateway's state: the upstreams with their keys, the price table, the live grants.

use super::grants::Grants;
use crate::{llm::Endpoint, models::Models};
use std::sync::Arc;

/// The two providers' upstreams (the real APIs, vLLM, Ollama: the runner's
/// `ANTHROPIC_BASE_URL` / `OPENAI_BASE_URL`) with the keys injected there.
pub struct LlmGateway {
    pub grants: Arc<Grants>,
    pub anthropic: Endpoint,
    pub openai: Endpoint,
    pub models: Models,
    pub(super) http: reqwest::Client,
    /// What provisioners dial for this replica (`ExecRequest.llm_gateway`).
    pub advertise: String,
    /// What sandboxes off the mesh's hosts (E2B) are given instead: the operator's URL
    /// of this replica's public listener (`FORKYARD_PUBLIC_LLM_GATEWAY_URL`); none: such
    /// sandboxes get no model access and their command-like agents are refused.
    pub public_url: Option<String>,
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
            public_url: None,
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
