//! The process-wide Prometheus registry, in a leaf of its own: the gRPC layers register
//! their metrics in it, and the `/metrics` endpoint ([`crate::metrics`], which re-exports
//! these) touches those metrics when it starts, so neither can hold it for the other.

use prometheus::Registry;
use std::sync::LazyLock;

/// The process-wide registry served at `/metrics`.
pub fn registry() -> &'static Registry {
    static REGISTRY: LazyLock<Registry> = LazyLock::new(Registry::new);
    &REGISTRY
}

/// Register `m` in the process-wide registry (a service's own metrics, beside the run metrics).
pub fn register<M: prometheus::core::Collector + Clone + 'static>(m: M) -> M {
    // Registering twice only happens if two statics share a name: a programming error
    // caught by the run metrics' unit test (in `metrics.rs`), not something a running
    // service can hit.
    registry()
        .register(Box::new(m.clone()))
        .expect("metric names are unique");
    m
}
