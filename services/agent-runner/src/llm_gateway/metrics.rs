//! The gateway's Prometheus metrics.

use prometheus::{Histogram, HistogramOpts, IntCounterVec, Opts};
use std::sync::LazyLock;

pub(super) struct Metrics {
    /// Requests answered, by API and HTTP status.
    pub requests: IntCounterVec,
    /// Requests refused before reaching a model, by reason: `unknown_token` (no such
    /// token, or its fork's command ended), `wrong_sandbox` (another fork's token),
    /// `budget`, `model`, `no_proxy_header`, `bad_request`, `upstream` (unreachable).
    pub refused: IntCounterVec,
    /// Time from a request's arrival to the upstream's response head.
    pub upstream_head: Histogram,
}

pub(super) fn get() -> &'static Metrics {
    static M: LazyLock<Metrics> = LazyLock::new(|| {
        use forkyard_common::metrics::register;
        Metrics {
            requests: register(
                IntCounterVec::new(
                    Opts::new(
                        "llm_gateway_requests_total",
                        "Model requests through the LLM gateway, by API and status",
                    ),
                    &["api", "status"],
                )
                .expect("valid metric"),
            ),
            refused: register(
                IntCounterVec::new(
                    Opts::new(
                        "llm_gateway_refused_total",
                        "Requests the LLM gateway refused, by reason",
                    ),
                    &["reason"],
                )
                .expect("valid metric"),
            ),
            upstream_head: register(
                Histogram::with_opts(
                    HistogramOpts::new(
                        "llm_gateway_upstream_head_seconds",
                        "From a request's arrival to the upstream's response head",
                    )
                    .buckets(vec![
                        0.005, 0.025, 0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                    ]),
                )
                .expect("valid metric"),
            ),
        }
    });
    &M
}
