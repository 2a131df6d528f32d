//! A span of its own for each fork the gateway's own activities work on, so a fork's
//! calls hang together under the activity's span in the run's trace.

use forkyard_common::telemetry::otel::{
    Context, KeyValue, global,
    trace::{TraceContextExt as _, Tracer as _},
};

/// A span named `name` for one fork (its run and number), under the current one.
pub(crate) fn span(name: &'static str, run_id: Option<String>, fork: Option<i64>) -> Context {
    let tracer = global::tracer("forkyard-gateway");
    let mut attrs = Vec::new();
    if let Some(run_id) = run_id {
        attrs.push(KeyValue::new("forkyard.run_id", run_id));
    }
    if let Some(fork) = fork {
        attrs.push(KeyValue::new("forkyard.fork", fork));
    }
    let parent = Context::current();
    let span = tracer
        .span_builder(name)
        .with_attributes(attrs)
        .start_with_context(&tracer, &parent);
    parent.with_span(span)
}
