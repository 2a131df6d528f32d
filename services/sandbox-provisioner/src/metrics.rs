//! The sandbox metrics (`sandbox_created_total`, `active_sandboxes`,
//! `sandbox_duration_seconds`), recorded where a backend really makes or removes a
//! sandbox: whoever asked (a gRPC caller such as the gateway or the janitor, a Temporal
//! activity, the TTL reaper), each sandbox is counted once. And the local backend's own:
//! how each new workspace was made (`sandbox_workspace_made_total`) and the warm copies
//! ready (`sandbox_warm_copies`), so an operator sees the creates that copied and can
//! size `--warm-copies-min`.

use forkyard_common::metrics;
use prometheus::{IntCounterVec, IntGauge, Opts};
use std::sync::LazyLock;

/// How a local sandbox's workspace was made (`Workspace::label`).
static WORKSPACE_MADE: LazyLock<IntCounterVec> = LazyLock::new(|| {
    metrics::register(
        IntCounterVec::new(
            Opts::new(
                "sandbox_workspace_made_total",
                "New local sandboxes' workspaces, by how each was made: warm_copy, template_copy, clone, snapshot",
            ),
            &["source"],
        )
        .expect("valid metric"),
    )
});

static WARM_COPIES: LazyLock<IntGauge> = LazyLock::new(|| {
    metrics::register(
        IntGauge::new(
            "sandbox_warm_copies",
            "Warm copies of templates' workspaces ready for creates, over all templates",
        )
        .expect("valid metric"),
    )
});

/// How a new workspace was made.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Workspace {
    /// A warm copy taken (one rename).
    WarmCopy,
    /// The template copied at the create.
    TemplateCopy,
    /// A git clone.
    Clone,
    /// A snapshot unpacked.
    Snapshot,
    /// An overlay of the template mounted (`crate::local::storage::overlay`).
    Overlay,
    /// A warm overlay taken (one rename; its mount made ahead).
    WarmOverlay,
}

impl Workspace {
    fn label(self) -> &'static str {
        match self {
            Self::WarmCopy => "warm_copy",
            Self::TemplateCopy => "template_copy",
            Self::Clone => "clone",
            Self::Snapshot => "snapshot",
            Self::Overlay => "overlay",
            Self::WarmOverlay => "warm_overlay",
        }
    }
}

/// A new sandbox's workspace was made as `how`.
pub(crate) fn workspace_made(how: Workspace) {
    WORKSPACE_MADE.with_label_values(&[how.label()]).inc();
}

/// The warm copies ready now.
pub(crate) fn warm_copies_ready(n: usize) {
    WARM_COPIES.set(i64::try_from(n).unwrap_or(i64::MAX));
}

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
