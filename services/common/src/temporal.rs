//! Connecting to Temporal and running a worker beside the gRPC server.

use crate::config::{Compression, TemporalArgs};

use temporalio_client::{Client, ClientOptions, Connection, ConnectionOptions, GrpcCompression};
use temporalio_sdk::{Runtime, Worker, WorkerOptions};

/// Connect to the Temporal frontend, retrying while it is not up yet (services and the
/// dev server start together) until `connect_timeout_secs` has passed.
/// One attempt to connect to Temporal (see [`crate::waiting`] for the retries: a
/// service waits for its Temporal, serving NOT_SERVING meanwhile).
pub async fn connect_once(args: &TemporalArgs, identity: &str) -> anyhow::Result<Client> {
    let mut url = args.url().map_err(anyhow::Error::msg)?;
    let tls = args.tls.options().map_err(anyhow::Error::msg)?;
    // An API key is only ever sent over TLS (Temporal Cloud's own rule too).
    let tls = tls.or_else(|| {
        args.api_key
            .as_ref()
            .map(|_| temporalio_client::TlsOptions::default())
    });
    if tls.is_some() && url.scheme() == "http" {
        // tonic only speaks TLS to an https URI.
        let _ = url.set_scheme("https");
    }
    let opts = ConnectionOptions::new(url.clone())
        .identity(identity.to_owned())
        .maybe_tls_options(tls)
        .maybe_api_key(args.api_key.as_ref().map(|k| k.expose().to_owned()))
        .grpc_compression(match args.compression {
            Compression::None => GrpcCompression::None,
            Compression::Gzip => GrpcCompression::Gzip,
        })
        .build();
    let conn = Connection::connect(opts).await.map_err(|e| {
        anyhow::anyhow!("cannot connect to temporal at {url} (TEMPORAL_ADDRESS): {e}")
    })?;
    // The OpenTelemetry plugin carries the trace in Temporal headers (client → workflow →
    // child workflow → activity) and spans each of those steps; workers built from this
    // client inherit it.
    let options = ClientOptions::new(args.namespace.clone())
        .plugin(temporalio_sdk::opentelemetry::OpenTelemetryPlugin::builder().build())
        // After the plugin, so it runs inside each activity's span.
        .plugin(crate::activity_telemetry::plugin())
        .build();
    Ok(Client::new(conn, options)?)
}

/// The SDK runtime on the current tokio runtime. Its worker metrics (task slots, poll and
/// schedule-to-start latencies, activity and workflow outcomes) go to a Prometheus
/// registry the SDK serves on an ephemeral loopback port; the service's own `/metrics`
/// appends that page, so there is one scrape target per service.
pub fn runtime() -> anyhow::Result<Runtime> {
    use temporalio_common::telemetry::{
        PrometheusExporterOptions, TelemetryOptions, start_prometheus_metric_exporter,
    };
    let mut telemetry = TelemetryOptions::builder().build();
    let prom = PrometheusExporterOptions::builder()
        .socket_addr(std::net::SocketAddr::from(([127, 0, 0, 1], 0)))
        .counters_total_suffix(true)
        .use_seconds_for_durations(true)
        .unit_suffix(true)
        .build();
    match start_prometheus_metric_exporter(prom) {
        Ok(started) => {
            crate::metrics::set_temporal_sdk_endpoint(started.bound_addr);
            telemetry.metrics = Some(started.meter);
        }
        Err(e) => tracing::warn!(error = %e, "temporal sdk metrics unavailable"),
    }
    let options = temporalio_sdk::runtime::RuntimeOptions::builder()
        .telemetry_options(telemetry)
        .build()
        .map_err(anyhow::Error::msg)?;
    Ok(Runtime::from_current_tokio(options)?)
}

/// Build a worker and return it with a handle that starts its graceful shutdown.
/// `Worker::run` is not `Send`: the caller runs it on its main task.
pub fn worker(
    runtime: &Runtime,
    client: Client,
    options: WorkerOptions,
) -> anyhow::Result<(Worker, impl Fn() + Send + Sync + 'static)> {
    let worker = Worker::new(runtime, client, options)?;
    let handle = worker.shutdown_handle();
    Ok((worker, handle))
}
