//! The gateway's security flags: authentication, tenant limits and call deadlines.

use super::{
    AuthMode, Authenticator,
    gate::GateLayer,
    keys::{KeyStore, check_tenant},
    limits::{LimitConfig, Limiter},
};
use crate::tenant_policy::TenantPolicy;
use forkyard_proto::budget::v1::budget_ledger_client::BudgetLedgerClient;
use std::{path::PathBuf, time::Duration};

#[derive(Debug, Clone, clap::Args)]
pub struct SecurityArgs {
    /// `api-key`: every call needs `authorization: Bearer <key>` (keys from `forkyard keys
    /// create`); `none`: no authentication, everything is the `default` tenant's (local only).
    #[arg(long, env = "FORKYARD_AUTH", value_enum, default_value = "api-key")]
    pub auth: AuthMode,
    /// The API key file (SQLite; digests only); default `<state dir>/gateway/api-keys.db`.
    #[arg(long, env = "FORKYARD_API_KEYS_DB", conflicts_with = "api_keys_url")]
    pub api_keys_db: Option<PathBuf>,
    /// The API keys' store as a URL, `postgres://…` where gateway replicas share it (the
    /// ledger's database serves) or `sqlite://<file>`; instead of `--api-keys-db`.
    #[arg(long, env = "FORKYARD_API_KEYS_URL", hide_env_values = true)]
    pub api_keys_url: Option<String>,
    /// Tenants that may manage the cleanup schedule (comma-separated).
    #[arg(long, env = "FORKYARD_ADMIN_TENANTS", value_delimiter = ',')]
    pub admin_tenants: Vec<String>,
    /// Calls per second one tenant may sustain.
    #[arg(long, env = "FORKYARD_TENANT_RATE", default_value_t = 50.0)]
    pub tenant_rate: f64,
    /// Calls one tenant may make in a burst above its rate.
    #[arg(long, env = "FORKYARD_TENANT_BURST", default_value_t = 100)]
    pub tenant_burst: u32,
    /// Calls of one tenant in flight at once.
    #[arg(long, env = "FORKYARD_TENANT_CONCURRENCY", default_value_t = 64)]
    pub tenant_concurrency: u32,
    /// Calls in flight over all tenants; beyond it calls are shed (RESOURCE_EXHAUSTED).
    #[arg(long, env = "FORKYARD_MAX_IN_FLIGHT", default_value_t = 1024)]
    pub max_in_flight: u32,
    /// WatchRun streams one tenant may hold open.
    #[arg(long, env = "FORKYARD_TENANT_WATCHES", default_value_t = 32)]
    pub tenant_watches: u32,
    /// Forks one tenant may have in flight over all its live runs (with api keys).
    #[arg(
        long,
        env = "FORKYARD_TENANT_MAX_CONCURRENT_FORKS",
        default_value_t = 1000
    )]
    pub tenant_max_concurrent_forks: u32,
    /// The spending limit (USD) a tenant's ledger account starts with on its first run.
    #[arg(long, env = "FORKYARD_TENANT_BUDGET_USD", default_value = "100")]
    pub tenant_budget_usd: String,
    /// Directories (comma-separated) that runs may name local repositories under, plain
    /// or as `file://`; `*` allows every path. Unset: every path with `--auth none`, none
    /// with API keys (a tenant could otherwise read any repository on the host).
    #[arg(long, env = "FORKYARD_LOCAL_REPO_ROOTS")]
    pub local_repo_roots: Option<String>,
    /// Git hosts runs may name remote repositories on (comma-separated `host`,
    /// `host:port`, `*.domain`, `*.domain:port`). Empty: any host whose addresses are all
    /// public; loopback, private, link-local (metadata) and other special addresses only
    /// for a host listed here exactly.
    #[arg(long, env = "FORKYARD_ALLOWED_GIT_HOSTS", value_delimiter = ',')]
    pub allowed_git_hosts: Vec<String>,
    /// The git credentials the mesh holds per tenant and host (a TOML file, read again
    /// when it changes; docs/security.md, Repositories): tokens and SSH deploy keys.
    #[arg(long, env = "FORKYARD_GIT_CREDENTIALS")]
    pub git_credentials: Option<std::path::PathBuf>,
    /// A token for github.com every tenant may use (the simplest form, for the local
    /// stack); a tenant's own entry in `--git-credentials` wins.
    #[arg(long, env = "GITHUB_TOKEN", hide_env_values = true)]
    pub github_token: Option<String>,
    /// Named host sets runs may ask for in `egress`, added to the built-in npm, pypi,
    /// crates, debian and github: `name=host,*.domain;name2=host:port`.
    #[arg(long, env = "FORKYARD_EGRESS_SETS")]
    pub egress_sets: Option<String>,
    /// What each tenant's runs may ask for in `egress`: `tenant=entry,…;*=entry,…` where
    /// an entry is a host pattern, a set name, or `*` (any public host); `*` names every
    /// tenant not listed. Unset: any public host with `--auth none`, the named sets only
    /// with API keys. Loopback, link-local and private addresses only when listed as such.
    #[arg(long, env = "FORKYARD_TENANT_EGRESS")]
    pub tenant_egress: Option<String>,
    /// The backend a run's sandboxes are made on when it names none: `local` (the
    /// provisioners' hosts) or `e2b` (E2B's cloud, where the provisioners have its key).
    #[arg(long, env = "FORKYARD_DEFAULT_BACKEND", default_value = "local")]
    pub default_backend: String,
    /// Which backends each tenant's runs may name: `tenant=local,e2b;*=local` (`*`: every
    /// tenant not listed). Unset: every backend the provisioners offer, for everyone.
    #[arg(long, env = "FORKYARD_TENANT_BACKENDS")]
    pub tenant_backends: Option<String>,
    /// Longest one API call may take, its calls to Temporal and the ledger included.
    #[arg(long, env = "FORKYARD_CALL_DEADLINE_SECS", default_value_t = 30)]
    pub call_deadline_secs: u64,
}

impl SecurityArgs {
    pub fn deadline(&self) -> Duration {
        Duration::from_secs(self.call_deadline_secs)
    }

    fn limits(&self) -> Result<LimitConfig, String> {
        if !(self.tenant_rate.is_finite() && self.tenant_rate > 0.0) {
            return Err("--tenant-rate (FORKYARD_TENANT_RATE) must be a number above 0".into());
        }
        for (flag, v) in [
            ("--tenant-burst (FORKYARD_TENANT_BURST)", self.tenant_burst),
            (
                "--tenant-concurrency (FORKYARD_TENANT_CONCURRENCY)",
                self.tenant_concurrency,
            ),
            (
                "--max-in-flight (FORKYARD_MAX_IN_FLIGHT)",
                self.max_in_flight,
            ),
            (
                "--tenant-watches (FORKYARD_TENANT_WATCHES)",
                self.tenant_watches,
            ),
            (
                "--tenant-max-concurrent-forks (FORKYARD_TENANT_MAX_CONCURRENT_FORKS)",
                self.tenant_max_concurrent_forks,
            ),
        ] {
            if v == 0 {
                return Err(format!("{flag} must be at least 1"));
            }
        }
        if self.call_deadline_secs == 0 {
            return Err(
                "--call-deadline-secs (FORKYARD_CALL_DEADLINE_SECS) must be at least 1".into(),
            );
        }
        Ok(LimitConfig {
            tenant_rate: self.tenant_rate,
            tenant_burst: self.tenant_burst,
            tenant_concurrency: self.tenant_concurrency,
            max_in_flight: self.max_in_flight,
            tenant_watches: self.tenant_watches,
        })
    }

    /// The mesh's git credentials (`--git-credentials`, `GITHUB_TOKEN`).
    fn credentials(&self) -> Result<forkyard_common::git_credentials::GitCredentials, String> {
        forkyard_common::git_credentials::GitCredentials::open(
            self.git_credentials.clone(),
            self.github_token.clone(),
        )
        .map_err(|e| format!("--git-credentials: {e}"))
    }

    /// Check the repository and egress policies' settings (before anything starts, so a
    /// bad one is the first line the gateway prints).
    pub fn check_policies(&self, state_dir: &std::path::Path) -> Result<(), String> {
        let authenticated = matches!(self.auth, AuthMode::ApiKey);
        crate::repo_policy::RepoPolicy::from_setting(
            self.local_repo_roots.as_deref(),
            authenticated,
            state_dir,
        )?
        .with_git_hosts(&self.allowed_git_hosts)?;
        self.credentials()?;
        crate::egress_policy::EgressPolicy::from_settings(
            self.egress_sets.as_deref(),
            self.tenant_egress.as_deref(),
            authenticated,
        )?;
        self.backends()?;
        Ok(())
    }

    /// The gate, the tenant policy (tenant accounts in the ledger at `ledger_addr`) and
    /// the API keys' store (none without api keys); errors name the setting (exit 64).
    pub async fn build(
        &self,
        state_dir: &std::path::Path,
        ledger_addr: &str,
    ) -> Result<(GateLayer, TenantPolicy, Option<KeyStore>), String> {
        let limits = self.limits()?;
        let budget = forkyard_proto::Usd::parse(&self.tenant_budget_usd)
            .map(forkyard_proto::Usd::micros)
            .map_err(|e| format!("--tenant-budget-usd (FORKYARD_TENANT_BUDGET_USD): {e}"))?;
        let mut policy = TenantPolicy {
            max_concurrent_forks: self.tenant_max_concurrent_forks,
            default_budget_micros: budget,
            ledger: None,
            repos: crate::repo_policy::RepoPolicy::from_setting(
                self.local_repo_roots.as_deref(),
                matches!(self.auth, AuthMode::ApiKey),
                state_dir,
            )?
            .with_git_hosts(&self.allowed_git_hosts)?
            .with_credentials(std::sync::Arc::new(self.credentials()?)),
            egress: crate::egress_policy::EgressPolicy::from_settings(
                self.egress_sets.as_deref(),
                self.tenant_egress.as_deref(),
                matches!(self.auth, AuthMode::ApiKey),
            )?,
            backends: self.backends()?,
        };
        let mut keys = None;
        let auth = match self.auth {
            AuthMode::None => {
                tracing::warn!(
                    "authentication is off (FORKYARD_AUTH=none): every caller is tenant \"default\"; use only locally"
                );
                Authenticator::None
            }
            AuthMode::ApiKey => {
                let store = self.key_store(state_dir).await?;
                keys = Some(store.clone());
                let deadline = self.deadline();
                let channel = forkyard_common::discovery::balanced(
                    "--ledger-addr (FORKYARD_LEDGER_ADDR)",
                    ledger_addr,
                    move |ep| ep.timeout(deadline),
                )?;
                policy.ledger = Some(BudgetLedgerClient::new(
                    forkyard_common::grpc_telemetry::traced_channel(channel),
                ));
                Authenticator::Keys {
                    store,
                    admins: self.admin_tenants.iter().cloned().collect(),
                }
            }
        };
        Ok((GateLayer::new(auth, Limiter::new(limits)), policy, keys))
    }

    /// The backend policy of these settings (the provisioners not asked yet).
    fn backends(&self) -> Result<crate::backend_policy::BackendPolicy, String> {
        crate::backend_policy::BackendPolicy::from_settings(
            &self.default_backend,
            self.tenant_backends.as_deref(),
        )
    }

    /// The API keys' store (the admin tenants' names checked first), and a word in the
    /// log on how many keys it holds.
    async fn key_store(&self, state_dir: &std::path::Path) -> Result<KeyStore, String> {
        for t in &self.admin_tenants {
            check_tenant(t)
                .map_err(|e| format!("--admin-tenants (FORKYARD_ADMIN_TENANTS): {e}"))?;
        }
        let (store, place) = match &self.api_keys_url {
            Some(url) => {
                let store = KeyStore::connect(url).await.map_err(|e| {
                    // The URL may hold a password: only the store's own words.
                    format!("--api-keys-url (FORKYARD_API_KEYS_URL): {e}")
                })?;
                (store, url.split(':').next().unwrap_or("url").to_owned())
            }
            None => {
                let path = self
                    .api_keys_db
                    .clone()
                    .unwrap_or_else(|| state_dir.join("gateway").join("api-keys.db"));
                let store = KeyStore::open(&path).await.map_err(|e| {
                    format!(
                        "--api-keys-db (FORKYARD_API_KEYS_DB) {}: {e}",
                        path.display()
                    )
                })?;
                (store, path.display().to_string())
            }
        };
        let keys = store.list().await.map_err(|e| e.to_string())?;
        let valid = keys.iter().filter(|k| k.revoked_unix_ms == 0).count();
        tracing::info!(store = %place, valid_keys = valid, "api key authentication on");
        if valid == 0 {
            tracing::warn!(
                "no valid api keys yet: every call is refused until `forkyard keys create --tenant <name>`"
            );
        }
        Ok(store)
    }
}
