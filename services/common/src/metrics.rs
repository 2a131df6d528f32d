//! Prometheus `/metrics` over plain HTTP, beside a service's gRPC port.
//!
//! Every service exposes one process-wide [`registry`]: the run metrics below (same names
//! as the seed, registered in every service so dashboards can sum across the mesh; each is
//! recorded by the one service that observes the event, see docs/observability.md), the gRPC
//! request metrics of [`crate::grpc_telemetry`], and the Temporal SDK's worker metrics,
//! which the SDK keeps in a registry of its own and which are appended to the page.

use crate::http_limits::Limits;
pub use crate::metrics_registry::{register, registry};
use prometheus::{Histogram, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, Opts, Registry};
use std::{
    net::SocketAddr,
    sync::{LazyLock, OnceLock},
    time::Duration,
};

/// What a run does, by the seed's names.
pub struct RunMetrics {
    /// Forks finished, by final status (`succeeded`, `failed`, `cancelled`, …) and model.
    pub fork_completed: IntCounterVec,
    /// Wall time of a fork from start to final result, by status.
    pub fork_duration: HistogramVec,
    /// What a fork cost, by model.
    pub fork_cost: HistogramVec,
    /// Sandbox create attempts, by template (backend) and outcome (`ok` / `error`).
    pub sandbox_created: IntCounterVec,
    /// Lifetime of a sandbox from create to destroy.
    pub sandbox_duration: Histogram,
    /// What one agent run cost, by model.
    pub agent_cost: HistogramVec,
    /// Sandboxes this process currently holds.
    pub active_sandboxes: IntGauge,
}

/// The run metrics, registered on first use.
pub fn run() -> &'static RunMetrics {
    static RUN: LazyLock<RunMetrics> = LazyLock::new(RunMetrics::register);
    &RUN
}

impl RunMetrics {
    fn register() -> Self {
        let cost_buckets = vec![0.001, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0];
        Self {
            fork_completed: counter_vec(
                Opts::new(
                    "sandbox_fork_completed_total",
                    "Forks finished, by status and model",
                ),
                &["status", "model"],
            ),
            fork_duration: histogram_vec(
                HistogramOpts::new(
                    "sandbox_fork_duration_seconds",
                    "Fork wall time from start to result, by status",
                )
                .buckets(vec![
                    1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0,
                ]),
                &["status"],
            ),
            fork_cost: histogram_vec(
                HistogramOpts::new("sandbox_fork_cost_usd", "Cost of one fork in USD, by model")
                    .buckets(cost_buckets.clone()),
                &["model"],
            ),
            sandbox_created: counter_vec(
                Opts::new(
                    "sandbox_created_total",
                    "Sandbox creations, by template and status",
                ),
                &["template", "status"],
            ),
            sandbox_duration: register(
                Histogram::with_opts(
                    HistogramOpts::new(
                        "sandbox_duration_seconds",
                        "Sandbox lifetime from create to destroy",
                    )
                    .buckets(vec![1.0, 10.0, 60.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0]),
                )
                .expect("valid metric"),
            ),
            agent_cost: histogram_vec(
                HistogramOpts::new("agent_cost_usd", "Cost of one agent run in USD, by model")
                    .buckets(cost_buckets),
                &["model"],
            ),
            active_sandboxes: register(
                IntGauge::new(
                    "active_sandboxes",
                    "Sandboxes currently held by this process",
                )
                .expect("valid metric"),
            ),
        }
    }
}

fn counter_vec(opts: Opts, labels: &[&str]) -> IntCounterVec {
    register(IntCounterVec::new(opts, labels).expect("valid metric"))
}

fn histogram_vec(opts: HistogramOpts, labels: &[&str]) -> HistogramVec {
    register(HistogramVec::new(opts, labels).expect("valid metric"))
}

/// Address of the Temporal SDK's own Prometheus endpoint (loopback, ephemeral port),
/// whose page is appended to ours.
static TEMPORAL_SDK_METRICS: OnceLock<SocketAddr> = OnceLock::new();

pub(crate) fn set_temporal_sdk_endpoint(addr: SocketAddr) {
    let _ = TEMPORAL_SDK_METRICS.set(addr);
}

/// The SDK's page, fetched over loopback HTTP/1.0 (the SDK serves it with hyper; this is
/// its only client, so a few lines of HTTP beat a client dependency).
async fn temporal_sdk_page() -> Option<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = *TEMPORAL_SDK_METRICS.get()?;
    let fetch = async {
        let mut conn = tokio::net::TcpStream::connect(addr).await.ok()?;
        conn.write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")
            .await
            .ok()?;
        let mut raw = Vec::new();
        conn.read_to_end(&mut raw).await.ok()?;
        let text = String::from_utf8(raw).ok()?;
        let (head, body) = text.split_once("\r\n\r\n")?;
        let ok = head.starts_with("HTTP/1.1 200") || head.starts_with("HTTP/1.0 200");
        ok.then(|| body.to_owned())
    };
    tokio::time::timeout(std::time::Duration::from_secs(2), fetch)
        .await
        .ok()
        .flatten()
}

/// The full exposition: our registry, then the Temporal SDK's metrics.
pub async fn render(registry: &Registry) -> Result<String, prometheus::Error> {
    let mut body = String::new();
    prometheus::TextEncoder::new().encode_utf8(&registry.gather(), &mut body)?;
    if let Some(sdk) = temporal_sdk_page().await {
        body.push_str(&sdk);
    }
    Ok(body)
}

/// Serve `registry` at `GET /metrics` on `listener`, within `limits`
/// ([`crate::http_limits`]), until `shutdown` resolves.
pub async fn serve(
    listener: tokio::net::TcpListener,
    limits: Limits,
    registry: Registry,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) {
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let registry = registry.clone();
            async move {
                match render(&registry).await {
                    Ok(body) => (axum::http::StatusCode::OK, body),
                    Err(e) => (axum::http::StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
                }
            }
        }),
    );
    crate::http_limits::serve(listener, limits, app, shutdown).await;
}

/// Bind the metrics listener, naming the setting when the port is taken.
pub async fn bind(flag: &str, addr: SocketAddr) -> Result<tokio::net::TcpListener, String> {
    tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| format!("{flag}: cannot listen on {addr}: {e}"))
}

/// `--metrics-*` for the services that flatten them into their flags.
#[derive(Debug, Clone, clap::Args)]
pub struct MetricsArgs {
    /// Address of the Prometheus `/metrics` endpoint (default: 127.0.0.1:945x, the
    /// service's port from the design's table).
    #[arg(long = "metrics-listen", env = "FORKYARD_METRICS_LISTEN")]
    pub metrics_listen: Option<String>,
    /// Connections the endpoint holds at once; past them new ones wait in the kernel's
    /// backlog, so no number of scrapers or idle clients takes the service's descriptors.
    #[arg(
        long = "metrics-max-connections",
        env = "FORKYARD_METRICS_MAX_CONNECTIONS",
        default_value_t = 64,
        value_parser = clap::value_parser!(u32).range(1..)
    )]
    pub metrics_max_connections: u32,
    /// How long a request's head may take, from the accept or from the previous response
    /// on a kept-alive connection (so also how long one may wait between requests).
    #[arg(
        long = "metrics-header-timeout-secs",
        env = "FORKYARD_METRICS_HEADER_TIMEOUT_SECS",
        default_value_t = 10,
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    pub metrics_header_timeout_secs: u64,
    /// How long a connection may move no byte either way before it is closed.
    #[arg(
        long = "metrics-idle-timeout-secs",
        env = "FORKYARD_METRICS_IDLE_TIMEOUT_SECS",
        default_value_t = 60,
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    pub metrics_idle_timeout_secs: u64,
}

/// The metrics endpoint, bound, and the bounds it serves within.
pub struct MetricsListener {
    pub listener: tokio::net::TcpListener,
    pub limits: Limits,
}

/// The design's default metrics port of each service.
pub fn default_listen(service: &str) -> &'static str {
    match service {
        "gateway" => "127.0.0.1:9451",
        "sandbox-provisioner" => "127.0.0.1:9452",
        "agent-runner" => "127.0.0.1:9453",
        "budget-ledger" => "127.0.0.1:9454",
        _ => "127.0.0.1:9455",
    }
}

impl MetricsArgs {
    /// Bind the endpoint now (a bad or taken address exits 64 naming the flag) and serve
    /// the process registry on it for the life of the process.
    pub async fn start(&self, service: &str) {
        serve_registry(self.bind(service).await);
    }

    /// What the endpoint's connections are held to.
    pub fn limits(&self) -> Limits {
        Limits {
            max_connections: usize::try_from(self.metrics_max_connections).unwrap_or(usize::MAX),
            header_timeout: Duration::from_secs(self.metrics_header_timeout_secs),
            idle_timeout: Duration::from_secs(self.metrics_idle_timeout_secs),
        }
    }

    /// Bind the endpoint; a bad or taken address exits 64 naming the flag.
    pub async fn bind(&self, service: &str) -> MetricsListener {
        const FLAG: &str = "--metrics-listen (FORKYARD_METRICS_LISTEN)";
        let raw = self
            .metrics_listen
            .as_deref()
            .unwrap_or_else(|| default_listen(service));
        let addr =
            crate::config::parse_listen(FLAG, raw).unwrap_or_else(|e| crate::exit_config_error(e));
        let listener = bind(FLAG, addr)
            .await
            .unwrap_or_else(|e| crate::exit_config_error(e));
        MetricsListener {
            listener,
            limits: self.limits(),
        }
    }
}

/// Serve the process registry on `metrics` for the life of the process.
pub fn serve_registry(metrics: MetricsListener) {
    // Touch the metric families so every service's page lists them from the start.
    let _ = run();
    crate::grpc_telemetry::register_metrics();
    tokio::spawn(serve(
        metrics.listener,
        metrics.limits,
        registry().clone(),
        std::future::pending(),
    ));
}

/// Label value of a fork status (`FORK_STATUS_SUCCEEDED` → `succeeded`).
pub fn status_label(enum_name: &str) -> String {
    enum_name
        .trim_start_matches("FORK_STATUS_")
        .to_ascii_lowercase()
}

#[cfg(test)]
mod tests {
    #[test]
    fn run_metrics_register_once_with_the_seed_names() {
        let m = super::run();
        m.fork_completed
            .with_label_values(&["succeeded", "m"])
            .inc();
        m.active_sandboxes.set(2);
        let names: Vec<_> = super::registry()
            .gather()
            .into_iter()
            .map(|f| f.name().to_owned())
            .collect();
        for want in ["sandbox_fork_completed_total", "active_sandboxes"] {
            assert!(
                names.iter().any(|n| n == want),
                "{want} missing from {names:?}"
            );
        }
    }
}
