//! The shape every service's `main` ends with: gRPC (health + reflection + API) and the
//! Temporal worker side by side; on SIGTERM/SIGINT health goes NOT_SERVING, the worker
//! drains its in-flight tasks, and the gRPC server finishes its open calls.

use crate::server::{self, Health};
use tokio::net::TcpListener;
use tonic::service::Routes;

pub struct Service {
    pub name: &'static str,
    pub listener: TcpListener,
    pub routes: Routes,
    pub health: Health,
}

/// Serve `svc` and run `worker` until a shutdown signal. `Worker::run` is not `Send`, so it
/// runs here on the caller's task while the gRPC server runs on a spawned one.
pub async fn run(
    svc: Service,
    mut worker: temporalio_sdk::Worker,
    stop_worker: impl Fn() + Send + Sync + 'static,
) -> anyhow::Result<()> {
    let addr = server::local_addr(&svc.listener);
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stop_tx = std::sync::Arc::new(stop_tx);
    let health = svc.health.clone();
    health.serving().await;
    tracing::info!(service = svc.name, %addr, "serving grpc");

    let signal_stop = stop_tx.clone();
    tokio::spawn(async move {
        crate::shutdown::signal_received().await;
        health.not_serving().await;
        stop_worker();
        let _ = signal_stop.send(true);
    });
    let mut server_stop = stop_rx;
    let server = tokio::spawn(server::serve(svc.listener, svc.routes, async move {
        let _ = server_stop.wait_for(|s| *s).await;
    }));

    let worker_result = worker.run().await;
    if let Err(e) = &worker_result {
        tracing::error!(service = svc.name, error = %e, "temporal worker stopped with an error");
    }
    // The worker only returns on shutdown or a fatal error: either way stop serving.
    let _ = stop_tx.send(true);
    server.await??;
    worker_result?;
    tracing::info!(service = svc.name, "stopped");
    Ok(())
}

/// `run` with the worker built here from `options`: the common ending of every `main`.
pub async fn run_with_worker(
    svc: Service,
    client: temporalio_client::Client,
    options: temporalio_sdk::WorkerOptions,
) -> anyhow::Result<()> {
    let runtime = crate::temporal::runtime()?;
    let (worker, stop) = crate::temporal::worker(&runtime, client, options)?;
    run(svc, worker, stop).await
}
