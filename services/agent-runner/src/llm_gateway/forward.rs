//! A checked request on its way upstream and back: its body read and its model checked,
//! sent with the real key in place of the fork's token, and the answer streamed back
//! through a [`Tap`] that meters it.

use super::{
    checks::checked_body,
    gateway::LlmGateway,
    grants::Grant,
    meter::{Api, Meter},
    metrics,
    reply::{Body, Provider, Refusal, error, refuse},
    tap::Tap,
};
use crate::llm::Endpoint;
use bytes::Bytes;
use futures::StreamExt;
use http_body_util::{BodyExt, Limited, StreamBody, combinators::BoxBody};
use hyper::{
    Request, Response, StatusCode,
    body::{Frame, Incoming},
    header::{self, HeaderMap, HeaderValue},
};
use std::sync::Arc;

/// Agents send whole conversations; far below this.
const MAX_REQUEST_BODY: usize = 32 << 20;

/// A request that passed the grant's checks, on its way upstream.
pub(super) struct Call {
    pub(super) provider: Provider,
    pub(super) api: Option<Api>,
    pub(super) path: String,
    pub(super) query: Option<String>,
    pub(super) started: std::time::Instant,
}

pub(super) async fn forward(
    gw: &Arc<LlmGateway>,
    grant: Arc<Grant>,
    call: Call,
    req: Request<Incoming>,
    span: tracing::Span,
) -> Response<Body> {
    let provider = call.provider;
    let (parts, body) = req.into_parts();
    let (model, body) = match request_body(gw, &grant, call.api, body).await {
        Ok(ok) => ok,
        Err(refusal) => return refuse(provider, refusal),
    };
    if call.api.is_some() {
        crate::genai::record_request(&span, provider.genai_name(), &model);
        // A branch point asked of the running fork is taken here, the agent waiting.
        grant
            .captures
            .at_request(|| grant.totals().requests, &body)
            .await;
    }
    let endpoint = match provider {
        Provider::Anthropic => &gw.anthropic,
        Provider::OpenAi => &gw.openai,
    };
    let seq = grant.begin();
    let upstream = gw
        .http
        .request(parts.method, upstream_url(endpoint, &call))
        .headers(upstream_headers(&parts.headers, endpoint, provider))
        .body(body)
        .send()
        .await;
    let upstream = match upstream {
        Ok(r) => r,
        Err(e) => return unreachable(&grant, endpoint, provider, &e),
    };
    let status = upstream.status();
    observe(&grant, &call, status, &span);
    let tap = match call.api.filter(|_| status.is_success()) {
        Some(api) => Some(Tap {
            gw: gw.clone(),
            grant,
            seq,
            model,
            meter: Meter::new(api, content_type(upstream.headers())),
            span,
        }),
        None => {
            // Errors and unmetered calls cost nothing.
            grant.abandon();
            None
        }
    };
    pass_back(upstream, provider, tap)
}

/// The request's body, read whole; for a metered API, its model checked against the
/// grant. The model and the body to send.
async fn request_body(
    gw: &LlmGateway,
    grant: &Grant,
    api: Option<Api>,
    body: Incoming,
) -> Result<(String, Bytes), Refusal> {
    let body = match Limited::new(body, MAX_REQUEST_BODY).collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => {
            return Err((
                "bad_request",
                StatusCode::PAYLOAD_TOO_LARGE,
                "request_too_large",
                "the request body is too large or was cut off".into(),
            ));
        }
    };
    match api {
        Some(api) => checked_body(gw, grant, api, &body),
        None => Ok((String::new(), body)),
    }
}

fn upstream_url(endpoint: &Endpoint, call: &Call) -> String {
    let base = endpoint.base_url.trim_end_matches('/');
    let rest = match call.provider {
        Provider::Anthropic => call.path.as_str(),
        // The OpenAI base URL already ends in /v1.
        Provider::OpenAi => call.path.strip_prefix("/v1").unwrap_or(&call.path),
    };
    match &call.query {
        Some(q) => format!("{base}{rest}?{q}"),
        None => format!("{base}{rest}"),
    }
}

/// Headers that belong to one hop, or carry a credential, or would make the upstream
/// compress what the meter must read.
fn hop_or_secret(name: &str) -> bool {
    matches!(
        name,
        "host"
            | "content-length"
            | "connection"
            | "keep-alive"
            | "proxy-connection"
            | "proxy-authorization"
            | "transfer-encoding"
            | "te"
            | "trailer"
            | "upgrade"
            | "accept-encoding"
            | "x-api-key"
            | "authorization"
    ) || name.starts_with("x-forkyard")
}

/// The agent's headers but those, with the upstream's real key in the provider's header.
fn upstream_headers(agent: &HeaderMap, endpoint: &Endpoint, provider: Provider) -> HeaderMap {
    let mut headers = HeaderMap::new();
    for (name, value) in agent {
        if !hop_or_secret(name.as_str()) {
            headers.append(name.clone(), value.clone());
        }
    }
    if let Some(key) = &endpoint.key {
        let (name, value) = match provider {
            Provider::Anthropic => ("x-api-key", key.expose().to_owned()),
            Provider::OpenAi => ("authorization", format!("Bearer {}", key.expose())),
        };
        if let Ok(mut v) = HeaderValue::from_str(&value) {
            v.set_sensitive(true);
            headers.insert(name, v);
        }
    }
    headers
}

/// The upstream did not answer: the request counts as a failed model call and costs
/// nothing.
fn unreachable(
    grant: &Grant,
    endpoint: &Endpoint,
    provider: Provider,
    e: &reqwest::Error,
) -> Response<Body> {
    grant.upstream_failed(502);
    grant.abandon();
    let base = endpoint.base_url.trim_end_matches('/');
    let e = endpoint
        .key
        .as_ref()
        .map_or(e.to_string(), |k| k.scrub(&e.to_string()));
    tracing::warn!(run_id = %grant.run_id, fork = grant.fork, upstream = %base, error = %e, "model upstream unreachable");
    refuse(
        provider,
        (
            "upstream",
            StatusCode::BAD_GATEWAY,
            "api_error",
            format!("the model API at {base} cannot be reached"),
        ),
    )
}

/// The upstream's answer in the metrics and the request's span; a 429 or 5xx counts as
/// a failed model call.
fn observe(grant: &Grant, call: &Call, status: StatusCode, span: &tracing::Span) {
    let m = metrics::get();
    m.upstream_head
        .observe(call.started.elapsed().as_secs_f64());
    span.record("http.response.status_code", status.as_u16());
    if status.as_u16() == 429 || status.is_server_error() {
        grant.upstream_failed(status.as_u16());
    }
    m.requests
        .with_label_values(&[call.api.map_or("other", api_name), status.as_str()])
        .inc();
}

fn api_name(api: Api) -> &'static str {
    match api {
        Api::Messages => "messages",
        Api::ChatCompletions => "chat_completions",
        Api::Responses => "responses",
    }
}

fn content_type(headers: &reqwest::header::HeaderMap) -> &str {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
}

/// The upstream's answer to the agent: its status, its headers but the hop-by-hop ones,
/// and its body streamed, through `tap` when it is metered.
fn pass_back(upstream: reqwest::Response, provider: Provider, tap: Option<Tap>) -> Response<Body> {
    let mut response = Response::builder().status(upstream.status());
    for (name, value) in upstream.headers() {
        if !matches!(
            name.as_str(),
            "connection" | "keep-alive" | "transfer-encoding" | "trailer" | "upgrade"
        ) {
            response = response.header(name, value);
        }
    }
    let stream = upstream.bytes_stream();
    let body: Body = match tap {
        Some(mut tap) => BoxBody::new(StreamBody::new(stream.map(move |chunk| {
            let chunk = chunk.map_err(std::io::Error::other)?;
            tap.meter.feed(&chunk);
            Ok(Frame::data(chunk))
        }))),
        None => BoxBody::new(StreamBody::new(
            stream.map(|chunk| chunk.map(Frame::data).map_err(std::io::Error::other)),
        )),
    };
    response.body(body).unwrap_or_else(|e| {
        error(
            provider,
            StatusCode::BAD_GATEWAY,
            "api_error",
            &format!("bad upstream response: {e}"),
        )
    })
}
