//! SIGTERM / SIGINT handling.

use tokio::signal::unix::{SignalKind, signal};

/// Resolves on the first SIGTERM or SIGINT.
pub async fn signal_received() {
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %e, "cannot listen for SIGTERM; only ctrl-c stops this service");
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM received, shutting down"),
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT received, shutting down"),
    }
}
