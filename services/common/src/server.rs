//! gRPC server bootstrap: every service exposes `grpc.health.v1` and server reflection
//! beside its own API, and stops accepting work gracefully on shutdown.

use std::{future::Future, net::SocketAddr};
use tonic::{service::Routes, transport::Server};
use tonic_health::server::HealthReporter;

/// Health reporting for one service: SERVING once the service is up, NOT_SERVING on
/// shutdown, so load balancers drain it before it exits.
#[derive(Clone)]
pub struct Health {
    reporter: HealthReporter,
    service_name: &'static str,
}

/// A health service name that answers SERVING whenever the process is up, ready or not:
/// what liveness and startup probes ask, so a service waiting for a dependency (see
/// [`crate::waiting`]) is held out of traffic by readiness but never restarted.
pub const LIVENESS: &str = "forkyard.liveness";

impl Health {
    /// The process is up (whatever it can serve yet).
    pub async fn alive(&self) {
        self.reporter
            .set_service_status(LIVENESS, tonic_health::ServingStatus::Serving)
            .await;
    }

    pub async fn serving(&self) {
        self.alive().await;
        self.reporter
            .set_service_status(self.service_name, tonic_health::ServingStatus::Serving)
            .await;
        self.reporter
            .set_service_status("", tonic_health::ServingStatus::Serving)
            .await;
    }

    pub async fn not_serving(&self) {
        self.reporter
            .set_service_status(self.service_name, tonic_health::ServingStatus::NotServing)
            .await;
        self.reporter
            .set_service_status("", tonic_health::ServingStatus::NotServing)
            .await;
    }
}

/// Health and reflection routes for a service named `service_name` (its gRPC full
/// name, `NamedService::NAME`); the caller adds its own service to the returned routes.
pub fn base_routes(
    service_name: &'static str,
) -> Result<(Routes, Health), tonic_reflection::server::Error> {
    let (reporter, health_service) = tonic_health::server::health_reporter();
    // Advertise only what this service serves: the descriptor set holds every Forkyard
    // service, and `grpcurl list` must not show the gateway's API on the provisioner.
    let reflection = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(forkyard_proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
            // The error details every error carries (crate::status): grpcurl decodes
            // them through reflection.
            .register_encoded_file_descriptor_set(tonic_types::pb::FILE_DESCRIPTOR_SET)
            .with_service_name(service_name)
            .with_service_name("grpc.health.v1.Health")
    };
    let reflection_v1 = reflection().build_v1()?;
    let reflection_v1alpha = reflection().build_v1alpha()?;
    let routes = Routes::new(health_service)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha);
    Ok((
        routes,
        Health {
            reporter,
            service_name,
        },
    ))
}

/// Bind the listener now (so a port in use fails start-up at once, naming the address),
/// then serve until `shutdown` resolves.
pub async fn bind(addr: SocketAddr) -> Result<tokio::net::TcpListener, String> {
    tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| format!("cannot listen on {addr}: {e}"))
}

pub async fn serve(
    listener: tokio::net::TcpListener,
    routes: Routes,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), tonic::transport::Error> {
    let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
    let mut builder = Server::builder();
    // Mesh TLS (crate::tls), when installed at start-up.
    if let Some(tls) = crate::tls::mesh() {
        builder = builder.tls_config(tls.server_config())?;
    }
    builder
        // Every call: a span joined to the caller's trace, and count + latency by code.
        .layer(crate::grpc_telemetry::GrpcServerLayer)
        .add_routes(routes)
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await
}

/// Convenience for tests and clients: the address a listener actually got.
pub fn local_addr(listener: &tokio::net::TcpListener) -> SocketAddr {
    listener
        .local_addr()
        .expect("bound listener has an address")
}
