//! A service whose Temporal is not up yet: it stays up, answers its health checks
//! NOT_SERVING on its own port (a readiness probe holds traffic, a liveness probe sees it
//! alive), and keeps trying with backoff, naming the setting in its log. A crash loop for
//! a dependency that will come only slows its coming.
//!
//! The port serves health alone meanwhile; once Temporal answers, that server hands the
//! listener over to the service's own (connections open on it are closed, and clients
//! reconnect to the real one).

use crate::{TemporalArgs, server, temporal};
use std::time::{Duration, Instant};
use tokio::{
    net::{TcpListener, TcpStream},
    sync::mpsc::Receiver,
    task::JoinHandle,
};
use tokio_util::sync::CancellationToken;
use tonic::transport::Server;

/// Connect to Temporal, serving NOT_SERVING health on `listener` until it answers;
/// the listener back, and the client. Gives up only after `--temporal-connect-timeout-
/// secs` when that is set (0, the default: never).
pub async fn connect_while_not_serving(
    listener: TcpListener,
    service: &'static str,
    args: &TemporalArgs,
    identity: &str,
) -> anyhow::Result<(TcpListener, temporalio_client::Client)> {
    // A first try before anything else: the usual case, Temporal is up.
    if let Ok(client) = temporal::connect_once(args, identity).await {
        return Ok((listener, client));
    }
    let started = Instant::now();
    let waited = not_serving_while(
        listener,
        service,
        "temporal is not reachable",
        keep_trying(service, args, identity, started),
    )
    .await?;
    let (listener, client) = (waited.0, waited.1?);
    tracing::info!(
        service,
        waited_secs = started.elapsed().as_secs(),
        "temporal reachable"
    );
    Ok((listener, client))
}

/// Serve NOT_SERVING health on `listener` (and UNAVAILABLE, saying `why`, to calls of the
/// service itself) while `work` runs: for what a service needs before it can serve (its
/// Temporal, the gateway's search attributes). The listener back, and what `work` gave.
pub async fn not_serving_while<T>(
    listener: TcpListener,
    service: &'static str,
    why: &'static str,
    work: impl std::future::Future<Output = T>,
) -> anyhow::Result<(TcpListener, T)> {
    let stop = CancellationToken::new();
    let (acceptor, conns) = accept_until(listener, stop.clone());
    let placeholder = serve_not_serving(service, why, conns, stop.clone()).await?;
    let out = work.await;
    stop.cancel();
    let listener = acceptor.await?;
    let _ = placeholder.await;
    Ok((listener, out))
}

/// Connections accepted on `listener`, passed on until `stop`; the listener back then.
fn accept_until(
    listener: TcpListener,
    stop: CancellationToken,
) -> (
    JoinHandle<TcpListener>,
    Receiver<std::io::Result<TcpStream>>,
) {
    let (conns_tx, conns_rx) = tokio::sync::mpsc::channel::<std::io::Result<TcpStream>>(16);
    let acceptor = tokio::spawn(async move {
        loop {
            tokio::select! {
                () = stop.cancelled() => return listener,
                conn = listener.accept() => {
                    let conn = conn.map(|(c, _)| c);
                    if conns_tx.send(conn).await.is_err() {
                        return listener;
                    }
                }
            }
        }
    });
    (acceptor, conns_rx)
}

/// Health alone on `conns` until `stop`: NOT_SERVING for the service, alive.
async fn serve_not_serving(
    service: &'static str,
    why: &'static str,
    conns: Receiver<std::io::Result<TcpStream>>,
    stop: CancellationToken,
) -> anyhow::Result<JoinHandle<Result<(), tonic::transport::Error>>> {
    let (routes, health) = server::base_routes(service)?;
    health.not_serving().await;
    health.alive().await;
    // Calls to the service itself meanwhile: UNAVAILABLE (retry), not UNIMPLEMENTED.
    let routes =
        tonic::service::Routes::from(routes.into_axum_router().fallback(move || async move {
            tonic::Status::unavailable(format!("not serving yet: {why}"))
                .into_http::<axum::body::Body>()
        }));
    let mut builder = Server::builder();
    if let Some(tls) = crate::tls::mesh() {
        builder = builder.tls_config(tls.server_config())?;
    }
    let incoming = tokio_stream::wrappers::ReceiverStream::new(conns);
    Ok(tokio::spawn(
        builder
            .add_routes(routes)
            .serve_with_incoming_shutdown(incoming, async move { stop.cancelled().await }),
    ))
}

/// Temporal asked again with backoff (from 0.5 s, doubling up to 30 s, jittered: every
/// pod of a Deployment waits for the same server) until it answers, or until the
/// connect timeout since `started` passed.
async fn keep_trying(
    service: &'static str,
    args: &TemporalArgs,
    identity: &str,
    started: Instant,
) -> anyhow::Result<temporalio_client::Client> {
    let limit =
        (args.connect_timeout_secs > 0).then(|| Duration::from_secs(args.connect_timeout_secs));
    let mut delays =
        crate::backoff::doubling(Duration::from_millis(500), Some(Duration::from_secs(30)));
    loop {
        let delay = delays.next().unwrap_or(Duration::from_secs(30));
        match temporal::connect_once(args, identity).await {
            Ok(client) => return Ok(client),
            Err(e) => {
                if limit.is_some_and(|l| started.elapsed() >= l) {
                    anyhow::bail!("{e}");
                }
                tracing::warn!(
                    service,
                    setting = "--temporal-address (TEMPORAL_ADDRESS)",
                    address = %args.address,
                    error = %e,
                    retry_in_secs = delay.as_secs_f64(),
                    "temporal not reachable: not serving yet, retrying"
                );
                tokio::time::sleep(delay).await;
            }
        }
    }
}
