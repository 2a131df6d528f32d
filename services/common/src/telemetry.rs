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
//! over OTLP, gRPC or HTTP/protobuf, with headers and TLS as every OpenTelemetry SDK reads
//! them ([`crate::otlp_export`]). A collector that is down or settings that are malformed
//! never stop the service: spans are dropped and one warning says so.

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
    EnvFilter, Layer as _,
    fmt::{FmtContext, FormatEvent, FormatFields, format::Writer},
    layer::SubscriberExt as _,
    registry::LookupSpan,
    util::SubscriberInitExt as _,
};

static PROVIDER: OnceLock<SdkTracerProvider> = OnceLock::new();

pub fn init(service: &'static str) {
    let (provider, exporting) = init_traces(service);
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        EnvFilter::new(
            "info,temporalio_sdk_core=warn,temporalio_client=warn,\
             opentelemetry=off,opentelemetry_sdk=off,opentelemetry_otlp=off",
        )
    });
    let logs = if std::io::stderr().is_terminal() {
        tracing_subscriber::fmt::layer()
            .event_format(WithTraceIds(tracing_subscriber::fmt::format()))
            .with_writer(std::io::stderr)
            .boxed()
    } else {
        tracing_subscriber::fmt::layer()
            .fmt_fields(tracing_subscriber::fmt::format::JsonFields::new())
            .event_format(json_format())
            .with_writer(std::io::stderr)
            .boxed()
    };
    let result = tracing_subscriber::registry()
        .with(logs.with_filter(filter))
        .with(span_layer(&provider))
        .try_init();
    if result.is_ok() {
        tracing::info!(service, version = env!("CARGO_PKG_VERSION"), "starting");
    }
    match exporting {
        Some(Ok(endpoint)) => tracing::info!(endpoint, "exporting traces over otlp"),
        Some(Err((endpoint, e))) => tracing::warn!(
            endpoint,
            error = %e,
            "otlp exporter settings unusable, spans are dropped"
        ),
        None => {}
    }
}

/// Forkyard's own `tracing` spans (a ledger charge, a sandbox command, a git step, a model
/// request) as OpenTelemetry spans, children of whatever span is current where they start
/// (a gRPC call's, a Temporal activity's), so they join the run's trace; and entering
/// one makes it the current context, so the gRPC calls made inside it hang under it.
///
/// Only spans of Forkyard's crates, at info or above, and never the log-only `activity`
/// span (the Temporal plugin already traces each activity). Independent of `RUST_LOG`:
/// quieter logs do not thin out traces.
fn span_layer<S>(provider: &SdkTracerProvider) -> impl tracing_subscriber::Layer<S>
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
{
    use opentelemetry::trace::TracerProvider as _;
    tracing_opentelemetry::layer()
        .with_tracer(provider.tracer("forkyard"))
        .with_filter(tracing_subscriber::filter::filter_fn(|meta| {
            meta.is_span()
                && meta.target().starts_with("forkyard")
                && meta.name() != "activity"
                && *meta.level() <= tracing::Level::INFO
        }))
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

/// What became of the `OTEL_EXPORTER_OTLP_*` settings ([`crate::otlp_export`]): `None`
/// nothing to export, else the endpoint, and why it cannot be used (said once logging
/// runs).
type Exporting = Option<Result<String, (String, String)>>;

/// Install the global propagator and tracer provider (once per process).
fn init_traces(service: &'static str) -> (SdkTracerProvider, Exporting) {
    if let Some(provider) = PROVIDER.get() {
        return (provider.clone(), None);
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
    let exporting = match crate::otlp_export::settings(&|k| std::env::var(k).ok()) {
        Ok(None) => None,
        Ok(Some(settings)) => Some(match exporter(&settings) {
            Ok(exporter) => {
                let batch = BatchSpanProcessor::builder(exporter).build();
                builder = builder.with_span_processor(WorkflowSpanProcessor::new(batch));
                Ok(settings.endpoint)
            }
            Err(e) => Err((settings.endpoint, e)),
        }),
        Err(e) => Some(Err((String::new(), e))),
    };
    let provider = builder.build();
    opentelemetry::global::set_tracer_provider(provider.clone());
    let provider = PROVIDER.get_or_init(|| provider).clone();
    (provider, exporting)
}

/// The exporter the environment asks for, wrapped to warn once when it cannot deliver.
fn exporter(settings: &crate::otlp_export::Settings) -> Result<WarnOnce, String> {
    Ok(WarnOnce {
        inner: crate::otlp_export::build(settings)?,
        endpoint: settings.endpoint.clone(),
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

/// Make `span`, a Forkyard span not yet entered, a child of `parent`: for work that
/// serves a trace begun elsewhere (a sandbox's model request, under the agent activity
/// that let it in).
pub fn set_parent(span: &tracing::Span, parent: opentelemetry::Context) {
    use tracing_opentelemetry::OpenTelemetrySpanExt as _;
    let _ = span.set_parent(parent);
}

/// Give `span` its OpenTelemetry name once what names it is known (a model request's
/// model, read from its body). Recording `otel.name` would not do: the layer applies it
/// only to a span not yet started, and a span is started as soon as it has a parent.
pub fn rename(span: &tracing::Span, name: String) {
    use opentelemetry::trace::TraceContextExt as _;
    use tracing_opentelemetry::OpenTelemetrySpanExt as _;
    span.context().span().update_name(name);
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
#[path = "telemetry_tests.rs"]
mod tests;
