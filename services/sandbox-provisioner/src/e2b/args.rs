//! The e2b backend's settings as the provisioner's command line and environment give
//! them (flattened into `crate::config::Args`), and their check.

use super::{ApiKey, E2bConfig};
use crate::local::core::config::Config;

#[derive(Debug, clap::Args)]
pub struct E2bArgs {
    /// E2B control-plane API (the key comes only from `E2B_API_KEY`).
    #[arg(
        long,
        env = "FORKYARD_E2B_API_URL",
        default_value = "https://api.e2b.dev"
    )]
    pub e2b_api_url: String,
    /// E2B sandbox domain (envd at `https://49983-<id>.<domain>`), or an http(s) base URL.
    #[arg(long, env = "FORKYARD_E2B_DOMAIN", default_value = "e2b.app")]
    pub e2b_domain: String,
    /// E2B template new sandboxes start from.
    #[arg(long, env = "FORKYARD_E2B_TEMPLATE", default_value = "base")]
    pub e2b_template: String,
    /// The E2B template for each image a create may name on the e2b backend:
    /// `IMAGE=TEMPLATE`, comma-separated (`python:3.12=py312,archive:node22=node-22`);
    /// an image not listed is refused.
    #[arg(long, env = "FORKYARD_E2B_TEMPLATES", value_delimiter = ',')]
    pub e2b_templates: Vec<String>,
    /// USD per second of an E2B sandbox's life.
    #[arg(long, env = "FORKYARD_E2B_SECOND_USD", default_value_t = 0.00003025)]
    pub e2b_second_usd: f64,
    /// The metering LLM gateway's public URL(s) (comma-separated; the agent runners'
    /// own setting of the same name): every E2B sandbox may reach these, besides the
    /// hosts its run's egress allowlist names, and nothing else.
    #[arg(long, env = "FORKYARD_PUBLIC_LLM_GATEWAY_URL", value_delimiter = ',')]
    pub public_llm_gateway_url: Vec<String>,
    /// Largest git bundle of a repository an E2B sandbox is given (bytes); a bigger
    /// one fails the create saying so.
    #[arg(long, env = "FORKYARD_E2B_BUNDLE_MAX_BYTES", default_value_t = crate::e2b::DEFAULT_BUNDLE_MAX_BYTES)]
    pub e2b_bundle_max_bytes: u64,
}

impl E2bArgs {
    /// The e2b backend's settings. Its key comes from `E2B_API_KEY` alone (never a flag,
    /// which `ps` would show); its command and clone limits are the local backend's.
    pub fn resolve(&self, local: &Config) -> Result<E2bConfig, String> {
        for (name, v) in [
            ("--e2b-api-url (FORKYARD_E2B_API_URL)", &self.e2b_api_url),
            ("--e2b-domain (FORKYARD_E2B_DOMAIN)", &self.e2b_domain),
            ("--e2b-template (FORKYARD_E2B_TEMPLATE)", &self.e2b_template),
        ] {
            if v.trim().is_empty() {
                return Err(format!("{name} is empty"));
            }
        }
        Ok(E2bConfig {
            api_url: self.e2b_api_url.trim().to_owned(),
            domain: self.e2b_domain.trim().to_owned(),
            template: self.e2b_template.trim().to_owned(),
            templates: crate::e2b::templates::parse(&self.e2b_templates)
                .map_err(|e| format!("--e2b-templates (FORKYARD_E2B_TEMPLATES): {e}"))?,
            api_key: std::env::var("E2B_API_KEY")
                .ok()
                .filter(|k| !k.trim().is_empty())
                .map(|k| ApiKey::new(k.trim())),
            exec_timeout: local.exec_timeout,
            clone_timeout: local.clone_timeout,
            second_usd: self.e2b_second_usd,
            allow_out: self
                .public_llm_gateway_url
                .iter()
                .filter(|u| !u.trim().is_empty())
                .map(|u| forkyard_common::e2b_egress::url_rule(u))
                .collect::<Result<_, _>>()
                .map_err(|e| {
                    format!("--public-llm-gateway-url (FORKYARD_PUBLIC_LLM_GATEWAY_URL): {e}")
                })?,
            bundle_max_bytes: self.e2b_bundle_max_bytes,
            ..E2bConfig::default()
        })
    }
}
