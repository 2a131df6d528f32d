//! The e2b backend's settings, and its API key (never printed).

use std::time::Duration;

/// The E2B API key. Debug/Display are redacted; only [`ApiKey::expose`] reveals it.
#[derive(Clone)]
pub struct ApiKey(String);

impl ApiKey {
    pub fn new(key: impl Into<String>) -> Self {
        Self(key.into())
    }
    pub(super) fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ApiKey(***)")
    }
}

#[derive(Debug, Clone)]
pub struct E2bConfig {
    /// Control plane, default `https://api.e2b.dev`.
    pub api_url: String,
    /// Sandbox domain: envd is `https://49983-<sandboxID>.<domain>`. A value starting
    /// with `http://` or `https://` is a base URL instead: every envd call goes there
    /// with headers `E2b-Sandbox-Id` / `E2b-Sandbox-Port` (a proxy, or the test server).
    pub domain: String,
    /// Template sandboxes are created from.
    pub template: String,
    /// The template for each image a create may name (`templates`); others are refused.
    pub templates: super::templates::Templates,
    /// `None` = the backend is disabled.
    pub api_key: Option<ApiKey>,
    /// Limit for one control-plane or envd request (not for a command's run).
    pub request_timeout: Duration,
    /// Sandbox lifetime when the request gives no `ttl_secs`.
    pub default_timeout: Duration,
    /// Exec wall-clock limit when the request gives none.
    pub exec_timeout: Duration,
    /// Limit for cloning the repository inside the sandbox.
    pub clone_timeout: Duration,
    /// USD per second of a sandbox's life (E2B bills by the second).
    pub second_usd: f64,
    /// `allowOut` entries every sandbox with an egress allowlist gets besides it: the
    /// metering LLM gateway's public address(es), which its agent talks to.
    pub allow_out: Vec<String>,
    /// Largest git bundle of a repository a sandbox is given.
    pub bundle_max_bytes: u64,
}

impl Default for E2bConfig {
    fn default() -> Self {
        Self {
            api_url: "https://api.e2b.dev".into(),
            domain: "e2b.app".into(),
            template: "base".into(),
            templates: super::templates::Templates::default(),
            api_key: None,
            request_timeout: Duration::from_secs(30),
            default_timeout: Duration::from_secs(3600),
            exec_timeout: Duration::from_secs(600),
            clone_timeout: Duration::from_secs(300),
            second_usd: crate::usage::Prices::default().e2b_second_usd,
            allow_out: Vec::new(),
            bundle_max_bytes: super::DEFAULT_BUNDLE_MAX_BYTES,
        }
    }
}
