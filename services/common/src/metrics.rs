//! Prometheus `/metrics` over plain HTTP, beside a service's gRPC port.

use std::net::SocketAddr;

/// Serve `registry` at `GET /metrics` on `listener` until `shutdown` resolves.
pub async fn serve(
    listener: tokio::net::TcpListener,
    registry: prometheus::Registry,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let registry = registry.clone();
            async move {
                let mut body = String::new();
                match prometheus::TextEncoder::new().encode_utf8(&registry.gather(), &mut body) {
                    Ok(()) => (axum::http::StatusCode::OK, body),
                    Err(e) => (axum::http::StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
                }
            }
        }),
    );
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
}

/// Bind the metrics listener, naming the setting when the port is taken.
pub async fn bind(flag: &str, addr: SocketAddr) -> Result<tokio::net::TcpListener, String> {
    tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| format!("{flag}: cannot listen on {addr}: {e}"))
}
