//! A finished fork's metrics (`sandbox_fork_completed_total{status,model}`,
//! `sandbox_fork_duration_seconds{status}`, `sandbox_fork_cost_usd{model}`) and span
//! attributes, by one rule whichever path finished it: the run workflow records its
//! inline forks (outside replay), the worker's interceptor (`crate::fork_telemetry`) a
//! child workflow's result.

use forkyard_common::{metrics, telemetry::otel::KeyValue};
use forkyard_proto::common::v1::{ForkResult, ForkStatus};

/// Record a finished fork's metrics, and return its status label and span attributes.
pub(crate) fn record(result: &ForkResult, model: &str) -> (String, Vec<KeyValue>) {
    let status = ForkStatus::try_from(result.status)
        .map(|s| metrics::status_label(s.as_str_name()))
        .unwrap_or_else(|_| "unknown".to_owned());
    let model = if model.is_empty() { "none" } else { model };
    let cost = forkyard_proto::Usd::from_micros(result.cost_micros).dollars_f64();
    let secs = (result.finished_unix_ms - result.started_unix_ms).max(0) as f64 / 1000.0;
    let run = metrics::run();
    run.fork_completed
        .with_label_values(&[status.as_str(), model])
        .inc();
    run.fork_duration
        .with_label_values(&[status.as_str()])
        .observe(secs);
    run.fork_cost.with_label_values(&[model]).observe(cost);
    let usage = result.usage.unwrap_or_default();
    let attrs = vec![
        KeyValue::new("forkyard.status", status.clone()),
        KeyValue::new("forkyard.sandbox_id", result.sandbox_id.clone()),
        KeyValue::new("forkyard.cost_usd", cost),
        KeyValue::new("forkyard.input_tokens", usage.input_tokens as i64),
        KeyValue::new("forkyard.output_tokens", usage.output_tokens as i64),
    ];
    (status, attrs)
}
