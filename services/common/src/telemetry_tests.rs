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

/// Every finished span, for the test to read.
#[derive(Clone, Debug, Default)]
struct Collect(Arc<Mutex<Vec<opentelemetry_sdk::trace::SpanData>>>);

impl opentelemetry_sdk::trace::SpanExporter for Collect {
    async fn export(
        &self,
        batch: Vec<opentelemetry_sdk::trace::SpanData>,
    ) -> opentelemetry_sdk::error::OTelSdkResult {
        self.0.lock().unwrap().extend(batch);
        Ok(())
    }
}

#[test]
fn forkyard_spans_join_the_current_trace_and_parent_the_calls_made_inside() {
    use tracing_subscriber::layer::SubscriberExt as _;
    let spans = Collect::default();
    let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder()
        .with_simple_exporter(spans.clone())
        .build();
    let subscriber = tracing_subscriber::registry().with(super::span_layer(&provider));
    tracing::subscriber::with_default(subscriber, || {
        // An activity's span, as the Temporal plugin makes it.
        let activity = provider.tracer("temporal").start("RunActivity:agent.run");
        let cx = opentelemetry::Context::current_with_span(activity);
        let _attached = cx.clone().attach();
        let charge = tracing::info_span!(
            target: "forkyard_agent_runner::charge",
            "ledger.charge",
            turn = 1
        );
        // A gRPC client span started inside it, as the traced channel does.
        charge.in_scope(|| {
            provider
                .tracer("forkyard-grpc")
                .start("forkyard.budget.v1.BudgetLedger/Charge");
        });
        drop(charge);
        // Not Forkyard's, and the log-only activity span: neither is a trace span.
        tracing::info_span!(target: "h2::proto", "poll").in_scope(|| {});
        tracing::info_span!(target: "forkyard_common::activity_telemetry", "activity")
            .in_scope(|| {});
        tracing::debug_span!(target: "forkyard_agent_runner::charge", "chatty").in_scope(|| {});
        cx.span().end();
    });
    let spans = spans.0.lock().unwrap().clone();
    let names: Vec<&str> = spans.iter().map(|s| s.name.as_ref()).collect();
    let by_name = |n: &str| {
        spans
            .iter()
            .find(|s| s.name == n)
            .unwrap_or_else(|| panic!("no {n} span in {names:?}"))
    };
    let activity = by_name("RunActivity:agent.run");
    let charge = by_name("ledger.charge");
    let call = by_name("forkyard.budget.v1.BudgetLedger/Charge");
    assert_eq!(charge.parent_span_id, activity.span_context.span_id());
    assert_eq!(call.parent_span_id, charge.span_context.span_id());
    assert_eq!(
        call.span_context.trace_id(),
        activity.span_context.trace_id()
    );
    assert!(
        charge.attributes.iter().any(|kv| kv.key.as_str() == "turn"),
        "{:?}",
        charge.attributes
    );
    assert_eq!(names.len(), 3, "only those three: {names:?}");
}
