//! Prometheus `/metrics` over plain HTTP, beside a service's gRPC port.
//!
//! Every service exposes one process-wide [`registry`]: the run metrics below (same names
//! as the seed, registered in every service so dashboards can sum across the mesh; each is
//! recorded by the one service that observes the event, see docs/observability.md), the gRPC
//! request metrics of [`crate::grpc_telemetry`], and the Temporal SDK's worker metrics,
//! which the SDK keeps in a registry of its own and which are appended to the page.

pub use crate::metrics_registry::{register, registry};
use prometheus::{Histogram, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, Opts, Registry};
use std::{
    net::SocketAddr,
    sync::{LazyLock, OnceLock},
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

/// Serve `registry` at `GET /metrics` on `listener` until `shutdown` resolves.
pub async fn serve(
    listener: tokio::net::TcpListener,
    registry: Registry,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
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
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
}

/// Bind the metrics listener, naming the setting when the port is taken.
pub async fn bind(flag: &str, addr: SocketAddr) -> Result<tokio::net::TcpListener, String> {
    tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| format!("{flag}: cannot listen on {addr}: {e}"))
}

/// `--metrics-listen` for the services that flatten it into their flags.
#[derive(Debug, Clone, clap::Args)]
pub struct MetricsArgs {
    /// Address of the Prometheus `/metrics` endpoint (default: 127.0.0.1:945x, the
    /// service's port from the design's table).
    #[arg(long = "metrics-listen", env = "FORKYARD_METRICS_LISTEN")]
    pub metrics_listen: Option<String>,
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

    /// Bind the endpoint; a bad or taken address exits 64 naming the flag.
    pub async fn bind(&self, service: &str) -> tokio::net::TcpListener {
        const FLAG: &str = "--metrics-listen (FORKYARD_METRICS_LISTEN)";
        let raw = self
            .metrics_listen
            .as_deref()
            .unwrap_or_else(|| default_listen(service));
        let addr =
            crate::config::parse_listen(FLAG, raw).unwrap_or_else(|e| crate::exit_config_error(e));
        bind(FLAG, addr)
            .await
            .unwrap_or_else(|e| crate::exit_config_error(e))
    }
}

/// Serve the process registry on `listener` for the life of the process.
pub fn serve_registry(listener: tokio::net::TcpListener) {
    // Touch the metric families so every service's page lists them from the start.
    let _ = run();
    crate::grpc_telemetry::register_metrics();
    tokio::spawn(async move {
        if let Err(e) = serve(listener, registry().clone(), std::future::pending()).await {
            tracing::warn!(error = %e, "metrics endpoint stopped");
        }
    });
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
