//! The runner's settings (flags, each with its environment variable), checked at
//! start-up, and the runner they make.

use crate::{
    drivers::Drivers,
    llm_gateway::{self, LlmGateway},
    models::Models,
    provisioners::Provisioners,
    runner::{Runner, short_call_channel},
    transcript::ArtifactStore,
};
use clap::Parser;
use forkyard_common::{
    TemporalArgs,
    balance::Balanced,
    config::{StateDirArg, parse_listen},
};
use std::{net::SocketAddr, path::PathBuf, sync::Arc, time::Duration};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

#[derive(Debug, Parser)]
#[command(
    name = "agent-runner",
    version,
    about = "Forkyard agent runner: runs one agent inside one sandbox"
)]
pub struct Args {
    /// Address the gRPC API listens on.
    #[arg(long, env = "FORKYARD_LISTEN", default_value = "127.0.0.1:50053")]
    pub listen: String,
    /// gRPC endpoint other services reach this replica at (a URL); each agent's result
    /// names it as where its transcript is, since transcripts stay in this replica's
    /// artifact store. Default `http://<listen>`, with the host name for 0.0.0.0 / ::.
    #[arg(long, env = "FORKYARD_AGENT_RUNNER_ADVERTISE_ADDR")]
    pub advertise_addr: Option<String>,
    /// Address the metering LLM gateway listens on: every command-like agent (command,
    /// claude-code, codex) reaches its model there, through its provisioner's relay.
    /// Empty: off (agents get no model access; the presets refuse to run).
    #[arg(long, env = "FORKYARD_LLM_LISTEN", default_value = "127.0.0.1:50056")]
    pub llm_listen: String,
    /// The LLM gateway's address as provisioners reach it (`http://host:port`). Default
    /// `http://<llm-listen>`, with the host name when listening on 0.0.0.0 or ::.
    #[arg(long, env = "FORKYARD_LLM_ADVERTISE_ADDR")]
    pub llm_advertise_addr: Option<String>,
    /// Connections the LLM gateway holds at once; past them new ones wait in the kernel's
    /// backlog. Default: a quarter of the open-files limit, at most 1,024.
    #[arg(long, env = "FORKYARD_LLM_MAX_CONNECTIONS", value_parser = clap::value_parser!(u32).range(1..))]
    pub llm_max_connections: Option<u32>,
    /// How long a request's head may take at the LLM gateway, from the connection's
    /// sandbox header or the previous response (so also how long an agent's kept-alive
    /// connection may wait between requests).
    #[arg(long, env = "FORKYARD_LLM_HEADER_TIMEOUT_SECS", default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..))]
    pub llm_header_timeout_secs: u64,
    /// How long an LLM gateway connection may move no byte either way before it is closed
    /// (above a model's longest silence before its answer starts).
    #[arg(long, env = "FORKYARD_LLM_IDLE_TIMEOUT_SECS", default_value_t = 900, value_parser = clap::value_parser!(u64).range(1..))]
    pub llm_idle_timeout_secs: u64,
    /// The gateway's public listener and URL, for sandboxes off the mesh's hosts (E2B).
    #[command(flatten)]
    pub public_llm: crate::llm_public::PublicLlmArgs,
    /// The sandbox provisioner used when a sandbox names no owner replica.
    #[arg(
        long,
        env = "FORKYARD_PROVISIONER_ADDR",
        default_value = "http://127.0.0.1:50052"
    )]
    pub provisioner_addr: String,
    /// Seconds between heartbeats of a running agent (the workflow allows 20 s of silence).
    #[arg(long, env = "FORKYARD_HEARTBEAT_SECS", default_value_t = 5)]
    pub heartbeat_secs: u64,
    /// The budget ledger LLM drivers charge each model turn to.
    #[arg(
        long,
        env = "FORKYARD_LEDGER_ADDR",
        default_value = "http://127.0.0.1:50054"
    )]
    pub ledger_addr: String,
    /// JSON file with model aliases and prices (USD per million tokens), laid over the
    /// built-in table. API keys and base URLs come from ANTHROPIC_API_KEY,
    /// ANTHROPIC_BASE_URL, OPENAI_API_KEY and OPENAI_BASE_URL.
    #[arg(long, env = "FORKYARD_MODELS_FILE")]
    pub models_file: Option<PathBuf>,
    /// Tries per model API call (the first included) on 429/529/5xx and network errors,
    /// with exponential backoff from 1 s; then the activity fails and Temporal retries it.
    #[arg(long, env = "FORKYARD_MODEL_RETRIES", default_value_t = 6)]
    pub model_retries: u32,
    /// Most model turns of an LLM agent whose spec sets none.
    #[arg(long, env = "FORKYARD_MAX_TURNS", default_value_t = 50)]
    pub max_turns: u32,
    #[command(flatten)]
    pub state: StateDirArg,
    #[command(flatten)]
    pub temporal: TemporalArgs,
    #[command(flatten)]
    pub metrics: forkyard_common::metrics::MetricsArgs,
    /// Mesh TLS: this service's certificate, key and the mesh CA (mTLS when set).
    #[command(flatten)]
    pub tls: forkyard_common::tls::TlsArgs,
    #[command(flatten)]
    pub discovery: forkyard_common::discovery::DiscoveryArgs,
}

/// The settings checked and the LLM gateway's port bound: what the runner is made of.
pub struct Config {
    advertise: String,
    llm: Option<LlmListener>,
    ledger: Balanced,
    drivers: Drivers,
    state: PathBuf,
    provisioner_addr: String,
    heartbeat: Duration,
}

/// The LLM gateway's bound port, as given (`listen`) and as provisioners reach it, and
/// the bounds on its connections.
struct LlmListener {
    limits: forkyard_common::http_limits::Limits,
    listener: TcpListener,
    listen: String,
    advertise: String,
    /// The public listener for remote sandboxes, when configured.
    public: Option<crate::llm_public::PublicLlm>,
}

impl Args {
    /// Every setting checked, given the gRPC API's checked `listen` address, and the LLM
    /// gateway's port bound; else what is wrong with the first bad one.
    pub async fn resolve(&self, listen: SocketAddr) -> Result<Config, String> {
        let advertise = forkyard_common::advertise::resolve(
            "--advertise-addr (FORKYARD_AGENT_RUNNER_ADVERTISE_ADDR)",
            self.advertise_addr.as_deref(),
            listen,
        )?;
        if tonic::transport::Endpoint::from_shared(self.provisioner_addr.clone()).is_err() {
            return Err(format!(
                "--provisioner-addr (FORKYARD_PROVISIONER_ADDR) {:?} is not a URL",
                self.provisioner_addr
            ));
        }
        if !(1..=15).contains(&self.heartbeat_secs) {
            return Err(
                "--heartbeat-secs (FORKYARD_HEARTBEAT_SECS) must be 1-15 (the heartbeat timeout is 20 s)".into(),
            );
        }
        let llm = self.llm_listener().await?;
        let ledger = short_call_channel("--ledger-addr (FORKYARD_LEDGER_ADDR)", &self.ledger_addr)?;
        let models = Models::load(self.models_file.as_deref())
            .map_err(|e| format!("--models-file (FORKYARD_MODELS_FILE) {e}"))?;
        if self.max_turns == 0 {
            return Err("--max-turns (FORKYARD_MAX_TURNS) must be at least 1".into());
        }
        let state = self.state.ensure()?;
        if !(1..=20).contains(&self.model_retries) {
            return Err("--model-retries (FORKYARD_MODEL_RETRIES) must be 1-20".into());
        }
        Ok(Config {
            advertise,
            llm,
            ledger,
            drivers: self.drivers(models),
            state,
            provisioner_addr: self.provisioner_addr.clone(),
            heartbeat: Duration::from_secs(self.heartbeat_secs),
        })
    }

    /// The LLM gateway's port bound; none when `--llm-listen` is empty (the gateway off).
    async fn llm_listener(&self) -> Result<Option<LlmListener>, String> {
        if self.llm_listen.trim().is_empty() {
            if self.public_llm.bind().await?.is_some() {
                return Err("--llm-public-listen (FORKYARD_LLM_PUBLIC_LISTEN) needs the LLM gateway (--llm-listen)".into());
            }
            return Ok(None);
        }
        let setting = "--llm-listen (FORKYARD_LLM_LISTEN)";
        let addr = parse_listen(setting, &self.llm_listen)?;
        let advertise = forkyard_common::advertise::resolve(
            "--llm-advertise-addr (FORKYARD_LLM_ADVERTISE_ADDR)",
            self.llm_advertise_addr.as_deref(),
            addr,
        )?;
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|e| format!("{setting}: {e}"))?;
        let max_connections = self.llm_max_connections.map_or_else(
            || forkyard_common::http_limits::quarter_of_open_files(1024),
            |n| usize::try_from(n).unwrap_or(usize::MAX),
        );
        Ok(Some(LlmListener {
            limits: forkyard_common::http_limits::Limits {
                max_connections,
                header_timeout: Duration::from_secs(self.llm_header_timeout_secs),
                idle_timeout: Duration::from_secs(self.llm_idle_timeout_secs),
            },
            listener,
            listen: self.llm_listen.clone(),
            advertise,
            public: self.public_llm.bind().await?,
        }))
    }

    /// The drivers (keys and base URLs from the environment) with `models`, the turn
    /// limit and the model API's tries asked for.
    fn drivers(&self, models: Models) -> Drivers {
        let mut drivers = Drivers::from_env(models);
        drivers.max_turns = self.max_turns;
        drivers.anthropic.retry.attempts = self.model_retries;
        drivers.openai.retry.attempts = self.model_retries;
        drivers
    }
}

impl Config {
    /// The runner these settings make, its LLM gateway serving (over mesh TLS when set);
    /// else what is wrong with the TLS settings.
    pub fn runner(self) -> Result<Runner, String> {
        let llm_gateway = self
            .llm
            .map(|l| serve_llm_gateway(l, &self.drivers))
            .transpose()?;
        Ok(Runner {
            llm_gateway,
            provisioners: Provisioners::new(self.provisioner_addr),
            ledger: self.ledger,
            drivers: Arc::new(self.drivers),
            store: Some(ArtifactStore::new(self.state.join("artifacts"))),
            heartbeat: self.heartbeat,
            advertise: self.advertise,
            loops: Default::default(),
        })
    }
}

/// The LLM gateway to the drivers' upstreams, with their price table, serving on `l`.
fn serve_llm_gateway(l: LlmListener, drivers: &Drivers) -> Result<Arc<LlmGateway>, String> {
    let mut gw = LlmGateway::new(
        drivers.anthropic.clone(),
        drivers.openai.clone(),
        drivers.models.clone(),
        l.advertise,
    );
    gw.public_url = l.public.as_ref().map(|p| p.url.clone());
    let gw = Arc::new(gw);
    tracing::info!(listen = %l.listen, advertise = %gw.advertise, "llm gateway serving");
    if let Some(p) = l.public {
        tracing::info!(url = %p.url, "llm gateway serving remote sandboxes");
        tokio::spawn(llm_gateway::serve_public(
            gw.clone(),
            p.listener,
            l.limits,
            CancellationToken::new(),
        ));
    }
    let tls = forkyard_common::tls::mesh()
        .map(|t| {
            t.rustls_server()
                .map_err(|e| format!("--tls-cert (FORKYARD_TLS_CERT): {e}"))
        })
        .transpose()?;
    tokio::spawn(llm_gateway::serve_within(
        gw.clone(),
        l.listener,
        tls,
        l.limits,
        CancellationToken::new(),
    ));
    Ok(gw)
}
