//! The first steps every service binary takes, in the same order: the settings all of
//! them share are checked (each wrong one exits 64 naming it, `--flag (ENV)`), the gRPC
//! port is bound, then metrics and logging start, so a taken port or a bad setting is
//! the first line a pod prints. What each service adds (its own settings, its state) goes
//! between [`Startup::check`] and [`Startup::bind`].

use crate::{
    config::{TemporalArgs, exit_config_error, parse_listen},
    discovery::DiscoveryArgs,
    metrics::MetricsArgs,
    server, telemetry,
    tls::{ClientAuth, TlsArgs},
};
use std::net::SocketAddr;
use tokio::net::TcpListener;

/// A service's shared settings.
pub struct Startup<'a> {
    pub name: &'static str,
    /// Mesh TLS, installed before any channel is built: internal services require a
    /// client certificate, the gateway (whose public callers use API keys) only takes one.
    pub tls: &'a TlsArgs,
    pub client_auth: ClientAuth,
    /// Services that call other services find their replicas through it.
    pub discovery: Option<&'a DiscoveryArgs>,
    pub temporal: &'a TemporalArgs,
}

impl Startup<'_> {
    /// Check and install the shared settings; `listen` is `--listen`, returned parsed.
    pub fn check(&self, listen: &str) -> SocketAddr {
        self.tls
            .install(self.client_auth)
            .unwrap_or_else(|e| exit_config_error(e));
        if let Some(discovery) = self.discovery {
            discovery.install().unwrap_or_else(|e| exit_config_error(e));
        }
        let addr = parse_listen("--listen (FORKYARD_LISTEN)", listen)
            .unwrap_or_else(|e| exit_config_error(e));
        if let Err(e) = self.temporal.url() {
            exit_config_error(e);
        }
        addr
    }

    /// Bind the gRPC port (exit 64 when it cannot be), then start metrics (`None`: the
    /// service serves its own registry) and logging.
    pub async fn bind(&self, addr: SocketAddr, metrics: Option<&MetricsArgs>) -> TcpListener {
        let listener = server::bind(addr)
            .await
            .unwrap_or_else(|e| exit_config_error(format!("--listen (FORKYARD_LISTEN): {e}")));
        if let Some(metrics) = metrics {
            metrics.start(self.name).await;
        }
        telemetry::init(self.name);
        listener
    }
}
