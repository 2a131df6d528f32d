//! The sandbox metrics (`sandbox_created_total`, `active_sandboxes`,
//! `sandbox_duration_seconds`), recorded where a backend really makes or removes a
//! sandbox: whoever asked (a gRPC caller such as the gateway or the janitor, a Temporal
//! activity, the TTL reaper), each sandbox is counted once.

use forkyard_common::metrics;

/// A create that made a new sandbox (`Ok`) or failed to (`Err`); a create answered
/// with an existing sandbox (same idempotency key) is not counted.
pub(crate) fn created<T, E>(backend: &str, out: &Result<T, E>) {
    let run = metrics::run();
    let status = if out.is_ok() { "ok" } else { "error" };
    run.sandbox_created
        .with_label_values(&[backend, status])
        .inc();
    if out.is_ok() {
        run.active_sandboxes.inc();
    }
}

/// A sandbox that existed was destroyed; `created_unix_ms` 0 = unknown age.
pub(crate) fn destroyed(created_unix_ms: i64) {
    let run = metrics::run();
    run.active_sandboxes.dec();
    let age_ms = crate::limits::now_ms().saturating_sub(created_unix_ms);
    if created_unix_ms > 0 && age_ms >= 0 {
        run.sandbox_duration.observe(age_ms as f64 / 1000.0);
    }
}
