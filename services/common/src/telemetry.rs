//! Logging and tracing.
//!
//! Logs: JSON lines when stderr is not a terminal (services under a supervisor),
//! human-readable text on a terminal; `RUST_LOG` filters, default `info`. Every line
//! written inside a traced operation carries `trace_id` and `span_id`, so a log line leads
//! to its trace and back.
//!
//! Traces: OpenTelemetry spans from the gRPC layers ([`crate::grpc_telemetry`]) and the
//! Temporal SDK's OpenTelemetry plugin ([`crate::temporal`]). A tracer provider is always
//! installed, so trace context flows across the mesh (and into logs) even with nothing
//! exporting; with `OTEL_EXPORTER_OTLP_ENDPOINT` set the spans also go to that collector
//! over OTLP/gRPC. A collector that is down or an endpoint that is malformed never stops
//! the service: spans are dropped and one warning says so.

use opentelemetry::trace::TraceContextExt as _;
use opentelemetry_sdk::{
    Resource,
    error::OTelSdkResult,
    trace::{BatchSpanProcessor, SdkTracerProvider, SpanData, SpanExporter},
};
use std::{
    fmt,
    io::IsTerminal,
    sync::{
        OnceLock,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};
use temporalio_sdk::opentelemetry::{WorkflowIdGenerator, WorkflowSpanProcessor};
use tracing_subscriber::{
    EnvFilter,
    fmt::{FmtContext, FormatEvent, FormatFields, format::Writer},
    registry::LookupSpan,
};

/// The environment variable naming the OTLP collector (gRPC, e.g. `http://localhost:4317`).
pub const OTLP_ENDPOINT_ENV: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";

static PROVIDER: OnceLock<SdkTracerProvider> = OnceLock::new();

pub fn init(service: &'static str) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        EnvFilter::new(
            "info,temporalio_sdk_core=warn,temporalio_client=warn,\
             opentelemetry=off,opentelemetry_sdk=off,opentelemetry_otlp=off",
        )
    });
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let result = if std::io::stderr().is_terminal() {
        let format = tracing_subscriber::fmt::format();
        builder.event_format(WithTraceIds(format)).try_init()
    } else {
        builder
            .fmt_fields(tracing_subscriber::fmt::format::JsonFields::new())
            .event_format(json_format())
            .try_init()
    };
    if result.is_ok() {
        tracing::info!(service, version = env!("CARGO_PKG_VERSION"), "starting");
    }
    init_traces(service);
}

/// One JSON object per line: `trace_id` and `span_id` first, then the event's fields
/// flattened, then the current `tracing` span's fields (an activity's `run_id`, `fork`).
fn json_format()
-> WithTraceIds<tracing_subscriber::fmt::format::Format<tracing_subscriber::fmt::format::Json>> {
    WithTraceIds(
        tracing_subscriber::fmt::format()
            .json()
            .flatten_event(true)
            .with_current_span(true),
    )
}

/// Install the global propagator and tracer provider (once per process).
fn init_traces(service: &'static str) {
    if PROVIDER.get().is_some() {
        return;
    }
    opentelemetry::global::set_text_map_propagator(
        opentelemetry_sdk::propagation::TraceContextPropagator::new(),
    );
    // Workflow spans must get the same ids on replay: the SDK's generator draws them
    // from the workflow's deterministic random stream, and falls back to random ids
    // everywhere else.
    let mut builder = SdkTracerProvider::builder()
        .with_id_generator(WorkflowIdGenerator::default())
        .with_resource(Resource::builder().with_service_name(service).build());
    let endpoint = std::env::var(OTLP_ENDPOINT_ENV).unwrap_or_default();
    if !endpoint.trim().is_empty() {
        match exporter(endpoint.trim()) {
            Ok(exporter) => {
                let batch = BatchSpanProcessor::builder(exporter).build();
                builder = builder.with_span_processor(WorkflowSpanProcessor::new(batch));
                tracing::info!(endpoint = endpoint.trim(), "exporting traces over otlp");
            }
            Err(e) => tracing::warn!(
                endpoint = endpoint.trim(),
                error = %e,
                "OTEL_EXPORTER_OTLP_ENDPOINT unusable, spans are dropped"
            ),
        }
    }
    let provider = builder.build();
    opentelemetry::global::set_tracer_provider(provider.clone());
    let _ = PROVIDER.set(provider);
}

/// The OTLP/gRPC exporter for `endpoint`, checked up front so a typo is one clear warning.
fn exporter(endpoint: &str) -> Result<WarnOnce, String> {
    let url = url::Url::parse(endpoint).map_err(|e| format!("not a URL: {e}"))?;
    // Plain OTLP/gRPC: the collector is a local sidecar or agent (TLS to a remote
    // backend is the collector's job).
    if url.scheme() != "http" || url.host_str().is_none() {
        return Err("needs http://host:port".into());
    }
    use opentelemetry_otlp::WithExportConfig as _;
    let builder = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_endpoint(endpoint)
        // An unreachable collector costs one short wait per batch on the exporter's own
        // thread, never a request's time.
        .with_timeout(Duration::from_secs(3));
    let inner = builder.build().map_err(|e| e.to_string())?;
    Ok(WarnOnce {
        inner,
        endpoint: endpoint.to_owned(),
        warned: AtomicBool::new(false),
    })
}

/// Flush buffered spans before the process exits, waiting at most 3 s: a collector that
/// swallows connections must not hold up a shutdown.
pub fn shutdown() {
    let Some(provider) = PROVIDER.get().cloned() else {
        return;
    };
    let (done, flushed) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = provider.force_flush();
        let _ = done.send(());
    });
    if flushed.recv_timeout(Duration::from_secs(3)).is_err() {
        tracing::warn!("spans still buffered at exit are dropped");
    }
}

/// An exporter that says once, not once per batch, that spans are being dropped.
#[derive(Debug)]
struct WarnOnce {
    inner: opentelemetry_otlp::SpanExporter,
    endpoint: String,
    warned: AtomicBool,
}

impl SpanExporter for WarnOnce {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let result = self.inner.export(batch).await;
        match &result {
            Err(e) if !self.warned.swap(true, Ordering::Relaxed) => tracing::warn!(
                endpoint = %self.endpoint,
                error = %e,
                "otlp collector unreachable, spans are dropped (warned once)"
            ),
            Ok(()) if self.warned.swap(false, Ordering::Relaxed) => {
                tracing::info!(endpoint = %self.endpoint, "otlp collector reachable again");
            }
            _ => {}
        }
        result
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

/// The current trace and span ids, when inside a traced operation.
pub fn current_ids() -> Option<(String, String)> {
    let cx = opentelemetry::Context::current();
    let span = cx.span();
    let sc = span.span_context();
    sc.is_valid()
        .then(|| (sc.trace_id().to_string(), sc.span_id().to_string()))
}

/// Wraps a formatter and puts `trace_id` / `span_id` of the current OpenTelemetry span
/// first on the line (as JSON fields, or as `key=value` text).
struct WithTraceIds<F>(F);

impl<S, N, F> FormatEvent<S, N> for WithTraceIds<F>
where
    F: FormatEvent<S, N>,
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &tracing::Event<'_>,
    ) -> fmt::Result {
        let Some((trace_id, span_id)) = current_ids() else {
            return self.0.format_event(ctx, writer, event);
        };
        let mut line = String::new();
        self.0.format_event(ctx, Writer::new(&mut line), event)?;
        match line.strip_prefix('{') {
            Some(rest) => write!(
                writer,
                "{{\"trace_id\":\"{trace_id}\",\"span_id\":\"{span_id}\",{rest}"
            ),
            None => write!(writer, "trace_id={trace_id} span_id={span_id} {line}"),
        }
    }
}

/// The OpenTelemetry API, for crates that annotate spans without depending on it.
pub use opentelemetry as otel;

#[cfg(test)]
mod tests {
    use opentelemetry::trace::{TraceContextExt as _, Tracer as _, TracerProvider as _};
    use std::sync::{Arc, Mutex};

    #[derive(Clone, Default)]
    struct Buf(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn log_line(inside_trace: bool) -> (serde_json::Value, Option<(String, String)>) {
        let buf = Buf::default();
        let writer = buf.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .fmt_fields(tracing_subscriber::fmt::format::JsonFields::new())
            .event_format(super::json_format())
            .finish();
        let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder().build();
        let cx = opentelemetry::Context::current_with_span(provider.tracer("test").start("op"));
        let ids = {
            let sc = cx.span().span_context().clone();
            (sc.trace_id().to_string(), sc.span_id().to_string())
        };
        tracing::subscriber::with_default(subscriber, || {
            let _attached = inside_trace.then(|| cx.clone().attach());
            let span = tracing::info_span!("activity", run_id = "run-7", fork = 2);
            let _entered = span.enter();
            tracing::info!(sandbox_id = "sb-1", "sandbox created");
        });
        let text = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
        let line = serde_json::from_str(text.trim()).expect("one json line");
        (line, inside_trace.then_some(ids))
    }

    #[test]
    fn json_log_lines_carry_trace_span_run_and_fork() {
        let (line, ids) = log_line(true);
        let (trace_id, span_id) = ids.unwrap();
        assert_eq!(line["trace_id"], trace_id.as_str(), "{line}");
        assert_eq!(line["span_id"], span_id.as_str(), "{line}");
        assert_eq!(line["message"], "sandbox created");
        assert_eq!(line["sandbox_id"], "sb-1");
        assert_eq!(line["span"]["run_id"], "run-7", "{line}");
        assert_eq!(line["span"]["fork"], 2, "{line}");
    }

    #[test]
    fn json_log_lines_outside_a_trace_have_no_ids() {
        let (line, _) = log_line(false);
        assert!(line.get("trace_id").is_none(), "{line}");
        assert_eq!(line["message"], "sandbox created");
    }
}
