//! The gateway's HTTP side: connections from provisioners' relays (a PROXY v2 header
//! naming the sandbox, then HTTP/1.1 from the agent), or on the public listener from
//! sandboxes off the mesh's hosts (E2B; the token alone names the fork), each request
//! checked, forwarded with the real key and metered on its way back.

use super::{
    checks::{checked_grant, route},
    forward::{Call, forward},
    gateway::LlmGateway,
    metrics,
    reply::{Body, Provider, error, refuse},
};
use forkyard_common::http_limits::{Idle, Limits, Slots};
use hyper::{Method, Request, Response, StatusCode, body::Incoming};
use std::{convert::Infallible, sync::Arc, time::Duration};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

/// How long a relayed connection may take to announce its sandbox.
const HEADER_TIMEOUT: Duration = Duration::from_secs(5);

/// The gateway's connection bounds unless configured (`--llm-max-connections`,
/// `--llm-header-timeout-secs`, `--llm-idle-timeout-secs`). The header timeout is also
/// how long an agent's kept-alive connection may wait between its requests; the idle
/// timeout outlasts a model's silence before its first byte (streamed responses send
/// something every few seconds).
pub const DEFAULT_LIMITS: Limits = Limits {
    max_connections: 1024,
    header_timeout: Duration::from_secs(60),
    idle_timeout: Duration::from_secs(900),
};

/// Where a connection comes from, and so who names its sandbox.
#[derive(Clone, Copy)]
enum Origin {
    /// A provisioner's relay: its PROXY v2 header names the sandbox.
    Relay,
    /// The public listener (behind the operator's TLS ingress): sandboxes off the mesh's
    /// hosts (E2B) connect straight, and the token alone names the fork; only tokens
    /// minted for such sandboxes are taken.
    Public,
}

/// [`serve_within`] the [`DEFAULT_LIMITS`].
pub async fn serve(
    gw: Arc<LlmGateway>,
    listener: TcpListener,
    tls: Option<forkyard_common::tls::tokio_rustls::TlsAcceptor>,
    stop: CancellationToken,
) {
    serve_within(gw, listener, tls, DEFAULT_LIMITS, stop).await;
}

/// Serve relayed connections on `listener` until `stop` fires, within `limits`
/// (`forkyard_common::http_limits`); with `tls` (mesh TLS), only over TLS from a mesh
/// client (a provisioner).
pub async fn serve_within(
    gw: Arc<LlmGateway>,
    listener: TcpListener,
    tls: Option<forkyard_common::tls::tokio_rustls::TlsAcceptor>,
    limits: Limits,
    stop: CancellationToken,
) {
    accept(gw, listener, tls, limits, stop, Origin::Relay).await;
}

/// Serve the public listener: connections from remote sandboxes (E2B), no PROXY header,
/// each request's token a remote sandbox's. TLS is the operator's ingress's, in front
/// of it (a remote sandbox holds no mesh certificate).
pub async fn serve_public(
    gw: Arc<LlmGateway>,
    listener: TcpListener,
    limits: Limits,
    stop: CancellationToken,
) {
    accept(gw, listener, None, limits, stop, Origin::Public).await;
}

async fn accept(
    gw: Arc<LlmGateway>,
    listener: TcpListener,
    tls: Option<forkyard_common::tls::tokio_rustls::TlsAcceptor>,
    limits: Limits,
    stop: CancellationToken,
    origin: Origin,
) {
    let slots = Slots::new(limits.max_connections);
    loop {
        let slot = tokio::select! {
            () = stop.cancelled() => return,
            slot = slots.take() => slot,
        };
        let conn = tokio::select! {
            () = stop.cancelled() => return,
            conn = listener.accept() => conn,
        };
        let conn = match conn {
            Ok((conn, _)) => conn,
            Err(e) => {
                // Out of descriptors (or the like): a pause rather than a busy loop.
                tracing::debug!(error = %e, "llm gateway accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let _ = conn.set_nodelay(true);
        let conn = Idle::new(conn, limits.idle_timeout);
        let (gw, tls) = (gw.clone(), tls.clone());
        tokio::spawn(async move {
            match tls {
                Some(tls) => match tokio::time::timeout(HEADER_TIMEOUT, tls.accept(conn)).await {
                    Ok(Ok(conn)) => serve_connection(gw, conn, &limits, origin).await,
                    Ok(Err(e)) => {
                        metrics::get().refused.with_label_values(&["tls"]).inc();
                        tracing::warn!(error = %e, "llm gateway tls handshake refused");
                    }
                    Err(_) => {}
                },
                None => serve_connection(gw, conn, &limits, origin).await,
            }
            drop(slot);
        });
    }
}

/// One connection: the sandbox it comes from (relayed), then its HTTP requests.
async fn serve_connection<S>(gw: Arc<LlmGateway>, mut conn: S, limits: &Limits, origin: Origin)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let sandbox = match origin {
        Origin::Relay => match relayed_sandbox(&mut conn).await {
            Some(id) => Some(id),
            None => return,
        },
        Origin::Public => None,
    };
    let service = hyper::service::service_fn(move |req| {
        let (gw, sandbox) = (gw.clone(), sandbox.clone());
        async move { Ok::<_, Infallible>(handle(&gw, sandbox.as_deref(), req).await) }
    });
    let _ = forkyard_common::http_limits::http1(limits)
        .serve_connection(hyper_util::rt::TokioIo::new(conn), service)
        .await;
}

/// The sandbox a relayed connection's PROXY header names; none (the connection is
/// dropped) without one in time.
async fn relayed_sandbox<S>(conn: &mut S) -> Option<Arc<str>>
where
    S: tokio::io::AsyncRead + Unpin,
{
    match tokio::time::timeout(
        HEADER_TIMEOUT,
        forkyard_common::proxy_header::read_sandbox_id(conn),
    )
    .await
    {
        Ok(Ok(id)) => Some(Arc::<str>::from(id)),
        Ok(Err(e)) => {
            metrics::get()
                .refused
                .with_label_values(&["no_proxy_header"])
                .inc();
            tracing::warn!(error = %e, "llm gateway connection without a sandbox header refused");
            None
        }
        Err(_) => None,
    }
}

async fn handle(
    gw: &Arc<LlmGateway>,
    sandbox: Option<&str>,
    req: Request<Incoming>,
) -> Response<Body> {
    let started = std::time::Instant::now();
    let path = req.uri().path().to_owned();
    let query = req.uri().query().map(str::to_owned);
    let Some((provider, api)) = route(req.method(), &path, req.headers()) else {
        return not_served(req.method(), &path);
    };
    let grant = match checked_grant(gw, sandbox, req.headers(), provider).await {
        Ok(g) => g,
        Err(refusal) => return refuse(provider, refusal),
    };
    // Under the fork's agent activity, which minted the grant: the request, its upstream
    // call and its charge join the run's trace.
    let span = crate::chat_span!(
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

/// A path the gateway does not serve, answered in the shape its name suggests.
fn not_served(method: &Method, path: &str) -> Response<Body> {
    let provider = if path.contains("messages") {
        Provider::Anthropic
    } else {
        Provider::OpenAi
    };
    error(
        provider,
        StatusCode::NOT_FOUND,
        "not_found_error",
        &format!("{method} {path} is not served here"),
    )
}
