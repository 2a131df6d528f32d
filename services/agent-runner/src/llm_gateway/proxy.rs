//! The gateway's HTTP side: connections from provisioners' relays (a PROXY v2 header
//! naming the sandbox, then HTTP/1.1 from the agent), each request checked, forwarded
//! with the real key and metered on its way back.

use super::{
    LlmGateway,
    grants::{Grant, Stop},
    meter::{Api, Meter},
    metrics,
};
use bytes::Bytes;
use futures::StreamExt;
use http_body_util::{BodyExt, Full, Limited, StreamBody, combinators::BoxBody};
use hyper::{
    Method, Request, Response, StatusCode,
    body::{Frame, Incoming},
    header::{self, HeaderMap, HeaderValue},
};
use serde_json::{Value, json};
use std::{convert::Infallible, sync::Arc, time::Duration};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

type Body = BoxBody<Bytes, std::io::Error>;

/// Agents send whole conversations; far below this.
const MAX_REQUEST_BODY: usize = 32 << 20;
/// How long a relayed connection may take to announce its sandbox.
const HEADER_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Provider {
    Anthropic,
    OpenAi,
}

/// Serve relayed connections on `listener` until `stop` fires; with `tls` (mesh TLS),
/// only over TLS from a mesh client (a provisioner).
pub async fn serve(
    gw: Arc<LlmGateway>,
    listener: TcpListener,
    tls: Option<forkyard_common::tls::tokio_rustls::TlsAcceptor>,
    stop: CancellationToken,
) {
    loop {
        let conn = tokio::select! {
            () = stop.cancelled() => return,
            conn = listener.accept() => conn,
        };
        let Ok((conn, _)) = conn else { continue };
        let _ = conn.set_nodelay(true);
        let (gw, tls) = (gw.clone(), tls.clone());
        tokio::spawn(async move {
            match tls {
                Some(tls) => match tokio::time::timeout(HEADER_TIMEOUT, tls.accept(conn)).await {
                    Ok(Ok(conn)) => serve_connection(gw, conn).await,
                    Ok(Err(e)) => {
                        metrics::get().refused.with_label_values(&["tls"]).inc();
                        tracing::warn!(error = %e, "llm gateway tls handshake refused");
                    }
                    Err(_) => {}
                },
                None => serve_connection(gw, conn).await,
            }
        });
    }
}

/// One relayed connection: the sandbox it comes from, then its HTTP requests.
async fn serve_connection<S>(gw: Arc<LlmGateway>, mut conn: S)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let sandbox = match tokio::time::timeout(
        HEADER_TIMEOUT,
        forkyard_common::proxy_header::read_sandbox_id(&mut conn),
    )
    .await
    {
        Ok(Ok(id)) => Arc::<str>::from(id),
        Ok(Err(e)) => {
            metrics::get()
                .refused
                .with_label_values(&["no_proxy_header"])
                .inc();
            tracing::warn!(error = %e, "llm gateway connection without a sandbox header refused");
            return;
        }
        Err(_) => return,
    };
    let service = hyper::service::service_fn(move |req| {
        let (gw, sandbox) = (gw.clone(), sandbox.clone());
        async move { Ok::<_, Infallible>(handle(&gw, &sandbox, req).await) }
    });
    let _ = hyper::server::conn::http1::Builder::new()
        .serve_connection(hyper_util::rt::TokioIo::new(conn), service)
        .await;
}

fn route(method: &Method, path: &str, headers: &HeaderMap) -> Option<(Provider, Option<Api>)> {
    use Provider::{Anthropic, OpenAi};
    match (method, path.trim_end_matches('/')) {
        (&Method::POST, "/v1/messages") => Some((Anthropic, Some(Api::Messages))),
        (&Method::POST, "/v1/messages/count_tokens") => Some((Anthropic, None)),
        (&Method::POST, "/v1/chat/completions") => Some((OpenAi, Some(Api::ChatCompletions))),
        (&Method::POST, "/v1/responses") => Some((OpenAi, Some(Api::Responses))),
        (&Method::GET, p) if p == "/v1/models" || p.starts_with("/v1/models/") => Some((
            if headers.contains_key("anthropic-version") {
                Anthropic
            } else {
                OpenAi
            },
            None,
        )),
        _ => None,
    }
}

/// An error in the provider's own shape, so the agent CLI shows the message.
fn error(provider: Provider, status: StatusCode, kind: &str, message: &str) -> Response<Body> {
    let message = format!("forkyard llm gateway: {message}");
    let body = match provider {
        Provider::Anthropic => {
            json!({"type": "error", "error": {"type": kind, "message": message}})
        }
        Provider::OpenAi => json!({"error": {"message": message, "type": kind, "code": kind}}),
    };
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "application/json")
        .body(full(body.to_string()))
        .expect("valid response")
}

fn full(text: String) -> Body {
    Full::new(Bytes::from(text))
        .map_err(|never| match never {})
        .boxed()
}

fn refused(reason: &str) {
    metrics::get().refused.with_label_values(&[reason]).inc();
}

/// The token an agent presents: Anthropic clients send `x-api-key`, OpenAI clients
/// `Authorization: Bearer`.
fn token_of(headers: &HeaderMap) -> Option<&str> {
    if let Some(v) = headers.get("x-api-key").and_then(|v| v.to_str().ok()) {
        return Some(v.trim());
    }
    let auth = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    auth.strip_prefix("Bearer ").map(str::trim)
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

async fn handle(gw: &Arc<LlmGateway>, sandbox: &str, req: Request<Incoming>) -> Response<Body> {
    let started = std::time::Instant::now();
    let path = req.uri().path().to_owned();
    let query = req.uri().query().map(str::to_owned);
    let Some((provider, api)) = route(req.method(), &path, req.headers()) else {
        let provider = if path.contains("messages") {
            Provider::Anthropic
        } else {
            Provider::OpenAi
        };
        return error(
            provider,
            StatusCode::NOT_FOUND,
            "not_found_error",
            &format!("{} {path} is not served here", req.method()),
        );
    };
    let grant = match token_of(req.headers()).and_then(|t| gw.grants.get(t)) {
        Some(g) => g,
        None => {
            refused("unknown_token");
            return error(
                provider,
                StatusCode::UNAUTHORIZED,
                "authentication_error",
                "the token is not valid (its fork's agent has ended, or it was never issued)",
            );
        }
    };
    if grant.sandbox_id != sandbox {
        refused("wrong_sandbox");
        tracing::warn!(run_id = %grant.run_id, fork = grant.fork, sandbox_id = %sandbox, token_sandbox_id = %grant.sandbox_id, "a sandbox presented another fork's llm token");
        return error(
            provider,
            StatusCode::FORBIDDEN,
            "permission_error",
            "this token belongs to another sandbox",
        );
    }
    grant.charges_posted(Duration::from_secs(10)).await;
    match grant.stopped() {
        Some(Stop::Spent(why)) => {
            refused("budget");
            return budget_spent(provider, &why);
        }
        Some(Stop::LedgerAway(why)) => {
            refused("ledger");
            return error(
                provider,
                StatusCode::SERVICE_UNAVAILABLE,
                "api_error",
                &format!("spend cannot be recorded: {why}"),
            );
        }
        None => {}
    }
    // Under the fork's agent activity, which minted the grant: the request, its upstream
    // call and its charge join the run's trace.
    let span = tracing::info_span!(
        "llm.request",
        run_id = %grant.run_id,
        fork = grant.fork,
        url.path = %path,
        http.response.status_code = tracing::field::Empty,
    );
    forkyard_common::telemetry::set_parent(&span, grant.trace.clone());
    let call = Call {
        provider,
        api,
        path,
        query,
        started,
    };
    forward(gw, grant, call, req, span.clone())
        .instrument(span)
        .await
}

/// A request that passed the grant's checks, on its way upstream.
struct Call {
    provider: Provider,
    api: Option<Api>,
    path: String,
    query: Option<String>,
    started: std::time::Instant,
}

async fn forward(
    gw: &Arc<LlmGateway>,
    grant: Arc<Grant>,
    call: Call,
    req: Request<Incoming>,
    span: tracing::Span,
) -> Response<Body> {
    let Call {
        provider,
        api,
        path,
        query,
        started,
    } = call;
    let (parts, body) = req.into_parts();
    let body = match Limited::new(body, MAX_REQUEST_BODY).collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => {
            refused("bad_request");
            return error(
                provider,
                StatusCode::PAYLOAD_TOO_LARGE,
                "request_too_large",
                "the request body is too large or was cut off",
            );
        }
    };
    let (model, body) = match api {
        Some(api) => match checked_body(gw, &grant, api, &body) {
            Ok(ok) => ok,
            Err((reason, status, kind, message)) => {
                refused(reason);
                return error(provider, status, kind, &message);
            }
        },
        None => (String::new(), body),
    };
    let endpoint = match provider {
        Provider::Anthropic => &gw.anthropic,
        Provider::OpenAi => &gw.openai,
    };
    let base = endpoint.base_url.trim_end_matches('/');
    let rest = match provider {
        Provider::Anthropic => path.as_str(),
        // The OpenAI base URL already ends in /v1.
        Provider::OpenAi => path.strip_prefix("/v1").unwrap_or(&path),
    };
    let url = match &query {
        Some(q) => format!("{base}{rest}?{q}"),
        None => format!("{base}{rest}"),
    };
    let mut headers = HeaderMap::new();
    for (name, value) in &parts.headers {
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
    let seq = grant.begin();
    let upstream = gw
        .http
        .request(parts.method, &url)
        .headers(headers)
        .body(body)
        .send()
        .await;
    let upstream = match upstream {
        Ok(r) => r,
        Err(e) => {
            grant.upstream_failed(502);
            grant.abandon();
            refused("upstream");
            let e = endpoint
                .key
                .as_ref()
                .map_or(e.to_string(), |k| k.scrub(&e.to_string()));
            tracing::warn!(run_id = %grant.run_id, fork = grant.fork, upstream = %base, error = %e, "model upstream unreachable");
            return error(
                provider,
                StatusCode::BAD_GATEWAY,
                "api_error",
                &format!("the model API at {base} cannot be reached"),
            );
        }
    };
    let m = metrics::get();
    m.upstream_head.observe(started.elapsed().as_secs_f64());
    let status = upstream.status();
    span.record("http.response.status_code", status.as_u16());
    if status.as_u16() == 429 || status.is_server_error() {
        grant.upstream_failed(status.as_u16());
    }
    m.requests
        .with_label_values(&[api.map_or("other", api_name), status.as_str()])
        .inc();
    let mut response = Response::builder().status(status);
    for (name, value) in upstream.headers() {
        if !matches!(
            name.as_str(),
            "connection" | "keep-alive" | "transfer-encoding" | "trailer" | "upgrade"
        ) {
            response = response.header(name, value);
        }
    }
    let content_type = upstream
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let stream = upstream.bytes_stream();
    let body: Body = match api.filter(|_| status.is_success()) {
        Some(api) => {
            let mut tap = Tap {
                gw: gw.clone(),
                grant,
                seq,
                model,
                meter: Meter::new(api, &content_type),
                span,
            };
            BoxBody::new(StreamBody::new(stream.map(move |chunk| {
                let chunk = chunk.map_err(std::io::Error::other)?;
                tap.meter.feed(&chunk);
                Ok(Frame::data(chunk))
            })))
        }
        None => {
            // Errors and unmetered calls cost nothing.
            grant.abandon();
            BoxBody::new(StreamBody::new(
                stream.map(|chunk| chunk.map(Frame::data).map_err(std::io::Error::other)),
            ))
        }
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

fn api_name(api: Api) -> &'static str {
    match api {
        Api::Messages => "messages",
        Api::ChatCompletions => "chat_completions",
        Api::Responses => "responses",
    }
}

fn budget_spent(provider: Provider, why: &str) -> Response<Body> {
    let message = format!("the fork's budget is spent: {why}");
    match provider {
        // Neither is retried by the CLIs: the agent stops and shows the message.
        Provider::Anthropic => error(
            provider,
            StatusCode::PAYMENT_REQUIRED,
            "billing_error",
            &message,
        ),
        Provider::OpenAi => error(
            provider,
            StatusCode::TOO_MANY_REQUESTS,
            "insufficient_quota",
            &message,
        ),
    }
}

type Refusal = (&'static str, StatusCode, &'static str, String);

/// The request's model, checked against the grant; the body to send (for a streamed
/// chat completion, asking for the usage chunk the meter needs).
fn checked_body(
    gw: &LlmGateway,
    grant: &Grant,
    api: Api,
    body: &Bytes,
) -> Result<(String, Bytes), Refusal> {
    let bad = |m: String| {
        (
            "bad_request",
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            m,
        )
    };
    let mut v: Value =
        serde_json::from_slice(body).map_err(|e| bad(format!("the body is not JSON: {e}")))?;
    let asked = v
        .get("model")
        .and_then(Value::as_str)
        .filter(|m| !m.is_empty())
        .ok_or_else(|| bad("the request names no model".into()))?;
    let model = gw
        .models
        .aliases
        .get(asked)
        .cloned()
        .unwrap_or_else(|| asked.to_owned());
    if !grant.allowed.permits(&model) {
        return Err((
            "model",
            StatusCode::FORBIDDEN,
            "permission_error",
            format!(
                "model {asked:?} is not allowed for this run (allowed: {})",
                grant.allowed.describe()
            ),
        ));
    }
    if api == Api::ChatCompletions && v.get("stream").and_then(Value::as_bool) == Some(true) {
        v["stream_options"]["include_usage"] = Value::Bool(true);
        return Ok((model, Bytes::from(v.to_string())));
    }
    Ok((model, body.clone()))
}

/// Reads a response's usage as it passes; when the body is done with (finished, failed
/// or dropped by a client that hung up) it prices what was used and charges it.
struct Tap {
    gw: Arc<LlmGateway>,
    grant: Arc<Grant>,
    seq: u32,
    /// The request's (allowed) model: the price, unless the table knows the one the
    /// response names.
    model: String,
    meter: Meter,
    /// The request's span: open until the response is delivered and charged.
    span: tracing::Span,
}

impl Drop for Tap {
    fn drop(&mut self) {
        self.meter.finish();
        let model = match &self.meter.model {
            Some(m) if self.gw.models.knows(m) => m.clone(),
            _ => self.model.clone(),
        };
        let usage = self.meter.usage;
        let cost = self.gw.models.price(&model).cost_micros(&usage);
        let (grant, seq) = (self.grant.clone(), self.seq);
        grant.delivered();
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                rt.spawn(
                    async move { grant.finish(seq, usage, cost).await }
                        .instrument(self.span.clone()),
                );
            }
            Err(_) => grant.undeliver(),
        }
    }
}
