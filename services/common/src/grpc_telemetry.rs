//! Tower layers that trace and count every gRPC call, server and client side.
//!
//! Server: the caller's W3C `traceparent` is read from the request metadata, a SERVER
//! span named `package.Service/Method` is its child, and the handler runs inside it (so
//! its logs, Temporal calls and outgoing gRPC calls join the trace). Client: a CLIENT
//! span is started under the current context and its `traceparent` is written into the
//! request metadata. Both count requests and observe latency by method and gRPC code; a
//! call ends (span closed, metrics recorded) when its response body ends — for streams,
//! when the stream ends — so the code is the one in the trailers.

use crate::metrics_registry::registry;
use http_body::{Body, Frame};
use opentelemetry::{
    Context, KeyValue, global,
    propagation::{Extractor, Injector},
    trace::{FutureExt as _, SpanKind, Status, TraceContextExt as _, Tracer as _},
};
use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, Opts};
use std::{
    future::Future,
    pin::Pin,
    sync::LazyLock,
    task::{Context as TaskContext, Poll},
    time::Instant,
};

/// The instrumentation scope of these spans.
const SCOPE: &str = "forkyard-grpc";

struct SideMetrics {
    requests: IntCounterVec,
    latency: HistogramVec,
}

fn side_metrics(side: &str) -> SideMetrics {
    let requests = IntCounterVec::new(
        Opts::new(
            format!("grpc_{side}_requests_total"),
            format!("gRPC calls ({side} side), by method and code"),
        ),
        &["method", "code"],
    )
    .expect("valid metric");
    let latency = HistogramVec::new(
        HistogramOpts::new(
            format!("grpc_{side}_request_duration_seconds"),
            format!("gRPC call latency ({side} side), by method and code"),
        )
        .buckets(vec![
            0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
        ]),
        &["method", "code"],
    )
    .expect("valid metric");
    let _ = registry().register(Box::new(requests.clone()));
    let _ = registry().register(Box::new(latency.clone()));
    SideMetrics { requests, latency }
}

static SERVER: LazyLock<SideMetrics> = LazyLock::new(|| side_metrics("server"));
static CLIENT: LazyLock<SideMetrics> = LazyLock::new(|| side_metrics("client"));

/// Canonical name of a gRPC status code (`OK`, `INVALID_ARGUMENT`, …).
pub fn code_name(code: i32) -> &'static str {
    const NAMES: [&str; 17] = [
        "OK",
        "CANCELLED",
        "UNKNOWN",
        "INVALID_ARGUMENT",
        "DEADLINE_EXCEEDED",
        "NOT_FOUND",
        "ALREADY_EXISTS",
        "PERMISSION_DENIED",
        "RESOURCE_EXHAUSTED",
        "FAILED_PRECONDITION",
        "ABORTED",
        "OUT_OF_RANGE",
        "UNIMPLEMENTED",
        "INTERNAL",
        "UNAVAILABLE",
        "DATA_LOSS",
        "UNAUTHENTICATED",
    ];
    usize::try_from(code)
        .ok()
        .and_then(|i| NAMES.get(i).copied())
        .unwrap_or("UNKNOWN")
}

fn grpc_status(headers: &http::HeaderMap) -> Option<i32> {
    headers.get("grpc-status")?.to_str().ok()?.parse().ok()
}

struct HeaderExtractor<'a>(&'a http::HeaderMap);

impl Extractor for HeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }
    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(http::HeaderName::as_str).collect()
    }
}

struct HeaderInjector<'a>(&'a mut http::HeaderMap);

impl Injector for HeaderInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(name), Ok(value)) = (
            http::HeaderName::from_bytes(key.as_bytes()),
            http::HeaderValue::from_str(&value),
        ) {
            self.0.insert(name, value);
        }
    }
}

/// Health probes and reflection are counted but not traced: they would bury the traces
/// people look for under a span every few seconds.
fn traced(method: &str) -> bool {
    !method.starts_with("grpc.health.") && !method.starts_with("grpc.reflection.")
}

fn start_span(method: &str, kind: SpanKind, parent: &Context) -> Context {
    if !traced(method) {
        return parent.clone();
    }
    let (service, name) = method.split_once('/').unwrap_or((method, ""));
    let tracer = global::tracer(SCOPE);
    let span = tracer
        .span_builder(method.to_owned())
        .with_kind(kind)
        .with_attributes([
            KeyValue::new("rpc.system", "grpc"),
            KeyValue::new("rpc.service", service.to_owned()),
            KeyValue::new("rpc.method", name.to_owned()),
        ])
        .start_with_context(&tracer, parent);
    parent.with_span(span)
}

/// One call in flight: recorded exactly once, when dropped (end of body, error, or the
/// peer going away — then the code is the one seen so far, else CANCELLED).
struct Finish {
    side: &'static LazyLock<SideMetrics>,
    method: String,
    start: Instant,
    cx: Option<Context>,
    code: Option<i32>,
}

impl Drop for Finish {
    fn drop(&mut self) {
        let code = self.code.unwrap_or(1);
        let name = code_name(code);
        let labels = [self.method.as_str(), name];
        self.side.requests.with_label_values(&labels).inc();
        self.side
            .latency
            .with_label_values(&labels)
            .observe(self.start.elapsed().as_secs_f64());
        if let Some(cx) = self.cx.take() {
            let span = cx.span();
            span.set_attribute(KeyValue::new("rpc.grpc.status_code", i64::from(code)));
            if code != 0 {
                span.set_status(Status::error(name));
            }
            span.end();
        }
    }
}

pin_project_lite::pin_project! {
    /// A response body that reports the call's end and status to its [`Finish`].
    pub struct Observed<B> {
        #[pin]
        inner: B,
        finish: Option<Finish>,
    }
}

impl<B: Body> Body for Observed<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.project();
        let polled = this.inner.poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let (Some(trailers), Some(f)) = (frame.trailers_ref(), this.finish.as_mut()) {
                    f.code = grpc_status(trailers).or(f.code);
                }
            }
            Poll::Ready(Some(Err(_))) => {
                if let Some(f) = this.finish.as_mut() {
                    f.code.get_or_insert(2);
                }
                this.finish.take();
            }
            Poll::Ready(None) => {
                this.finish.take();
            }
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

fn observe<S, B, RB>(
    inner: &mut S,
    mut req: http::Request<B>,
    server: bool,
) -> BoxFuture<Result<http::Response<Observed<RB>>, S::Error>>
where
    S: tower::Service<http::Request<B>, Response = http::Response<RB>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    let method = req.uri().path().trim_start_matches('/').to_owned();
    let side = if server { &SERVER } else { &CLIENT };
    let cx = if server {
        let parent = global::get_text_map_propagator(|p| {
            p.extract_with_context(&Context::new(), &HeaderExtractor(req.headers()))
        });
        start_span(&method, SpanKind::Server, &parent)
    } else {
        let cx = start_span(&method, SpanKind::Client, &Context::current());
        global::get_text_map_propagator(|p| {
            p.inject_context(&cx, &mut HeaderInjector(req.headers_mut()))
        });
        cx
    };
    let mut finish = Finish {
        side,
        method,
        start: Instant::now(),
        cx: cx.has_active_span().then(|| cx.clone()),
        code: None,
    };
    // `call` on the service ready from `poll_ready`, leaving a fresh clone in its place.
    let clone = inner.clone();
    let mut ready = std::mem::replace(inner, clone);
    let fut = {
        let _attached = cx.clone().attach();
        ready.call(req)
    };
    Box::pin(async move {
        match fut.with_context(cx).await {
            Ok(mut resp) => {
                if server {
                    missing_message_is_bad_input(resp.headers_mut());
                }
                // Trailers-only responses (every tonic error) carry the code in the headers.
                finish.code = grpc_status(resp.headers());
                let (parts, body) = resp.into_parts();
                let body = Observed {
                    inner: body,
                    finish: Some(finish),
                };
                Ok(http::Response::from_parts(parts, body))
            }
            Err(e) => {
                // Transport failure (connection refused, reset): no gRPC status exists.
                finish.code = Some(14);
                drop(finish);
                Err(e)
            }
        }
    })
}

/// A call whose body held no request message is the caller's mistake: tonic answers it
/// INTERNAL ("Missing request message."); the services say INVALID_ARGUMENT.
fn missing_message_is_bad_input(headers: &mut http::HeaderMap) {
    let missing = headers.get("grpc-status").is_some_and(|v| v == "13")
        && headers
            .get("grpc-message")
            .is_some_and(|v| v == "Missing%20request%20message.");
    if missing {
        headers.insert("grpc-status", http::HeaderValue::from_static("3"));
        headers.insert(
            "grpc-message",
            http::HeaderValue::from_static(
                "request:%20the%20call%20carried%20no%20request%20message",
            ),
        );
    }
}

macro_rules! layer {
    ($layer:ident, $svc:ident, $server:literal, $doc:literal) => {
        #[doc = $doc]
        #[derive(Debug, Clone, Copy, Default)]
        pub struct $layer;

        impl<S> tower::Layer<S> for $layer {
            type Service = $svc<S>;
            fn layer(&self, inner: S) -> $svc<S> {
                $svc { inner }
            }
        }

        #[doc = $doc]
        #[derive(Debug, Clone)]
        pub struct $svc<S> {
            inner: S,
        }

        impl<S, B, RB> tower::Service<http::Request<B>> for $svc<S>
        where
            S: tower::Service<http::Request<B>, Response = http::Response<RB>>
                + Clone
                + Send
                + 'static,
            S::Future: Send + 'static,
            S::Error: Send + 'static,
        {
            type Response = http::Response<Observed<RB>>;
            type Error = S::Error;
            type Future = BoxFuture<Result<Self::Response, S::Error>>;

            fn poll_ready(&mut self, cx: &mut TaskContext<'_>) -> Poll<Result<(), S::Error>> {
                self.inner.poll_ready(cx)
            }

            fn call(&mut self, req: http::Request<B>) -> Self::Future {
                observe(&mut self.inner, req, $server)
            }
        }
    };
}

layer!(
    GrpcServerLayer,
    GrpcServerTrace,
    true,
    "Traces and counts the calls a gRPC server handles."
);
layer!(
    GrpcClientLayer,
    GrpcClientTrace,
    false,
    "Traces and counts the calls a gRPC client makes, propagating the trace."
);

/// A channel to a peer (one replica or several, [`crate::balance`]) whose calls are
/// traced and counted.
pub type TracedChannel = GrpcClientTrace<crate::balance::Balanced>;

/// Wrap `channel` so its calls are traced and counted.
pub fn traced_channel(channel: impl Into<crate::balance::Balanced>) -> TracedChannel {
    tower::Layer::layer(&GrpcClientLayer, channel.into())
}

/// Touch both sides' metrics so they are listed before the first call.
pub fn register_metrics() {
    LazyLock::force(&SERVER);
    LazyLock::force(&CLIENT);
}

#[cfg(test)]
#[path = "grpc_telemetry_tests.rs"]
mod tests;
