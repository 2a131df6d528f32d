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
    worker: temporalio_sdk::Worker,
    stop_worker: impl Fn() + Send + Sync + 'static,
) -> anyhow::Result<()> {
    run_workers(svc, vec![(worker, Box::new(stop_worker))]).await
}

/// A worker's shutdown handle.
pub type StopWorker = Box<dyn Fn() + Send + Sync>;

/// `run` with several workers (one task queue each, e.g. a shared queue and a
/// replica's own). They all run on the caller's task; when one stops, all are stopped.
pub async fn run_workers(
    svc: Service,
    workers: Vec<(temporalio_sdk::Worker, StopWorker)>,
) -> anyhow::Result<()> {
    run_workers_draining(svc, workers, None).await
}

/// Waited for between NOT_SERVING and stopping the workers and the server: what a
/// replica must finish before it may go (the provisioner: the sandboxes it holds).
pub type Drain = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

async fn run_workers_draining(
    svc: Service,
    workers: Vec<(temporalio_sdk::Worker, StopWorker)>,
    drain: Option<Drain>,
) -> anyhow::Result<()> {
    let addr = server::local_addr(&svc.listener);
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stop_tx = std::sync::Arc::new(stop_tx);
    let health = svc.health.clone();
    let peers_ready = start_serving(&health).await;
    tracing::info!(service = svc.name, %addr, "serving grpc");
    tokio::spawn(follow_peers(
        svc.health.clone(),
        stop_rx.clone(),
        peers_ready,
    ));

    let (mut workers, stops): (Vec<_>, Vec<_>) = workers.into_iter().unzip();
    let stops = std::sync::Arc::new(stops);
    let stop_all = {
        let stops = stops.clone();
        move || stops.iter().for_each(|stop| stop())
    };
    tokio::spawn(stop_on_signal(
        health,
        drain,
        stop_all.clone(),
        stop_tx.clone(),
    ));
    let mut server_stop = stop_rx;
    let server = tokio::spawn(server::serve(svc.listener, svc.routes, async move {
        let _ = server_stop.wait_for(|s| *s).await;
    }));

    let results = futures::future::join_all(workers.iter_mut().map(|worker| {
        let stop_all = stop_all.clone();
        async move {
            let result = worker.run().await;
            if let Err(e) = &result {
                tracing::error!(service = svc.name, task_queue = worker.task_queue(), error = %e, "temporal worker stopped with an error");
            }
            // One worker gone (shutdown or fatal error): stop the others too.
            stop_all();
            result
        }
    }))
    .await;
    // The workers only return on shutdown or a fatal error: either way stop serving.
    let _ = stop_tx.send(true);
    server.await??;
    for result in results {
        result?;
    }
    // Spans still buffered go out before the process exits (bounded by the exporter timeout).
    crate::telemetry::shutdown();
    tracing::info!(service = svc.name, "stopped");
    Ok(())
}

/// SERVING, once the peers' names resolve too (else NOT_SERVING until they do, which
/// [`follow_peers`] watches); whether they did.
async fn start_serving(health: &Health) -> bool {
    let peers_ready = crate::discovery::waiting_for().is_empty();
    if peers_ready {
        health.serving().await;
    } else {
        tracing::warn!(settings = ?crate::discovery::waiting_for(), "peer names resolve to no replica yet: not serving until they do");
        health.alive().await;
        health.not_serving().await;
    }
    peers_ready
}

/// On SIGTERM/SIGINT: NOT_SERVING, the drain, then the workers and the server stopped.
async fn stop_on_signal(
    health: Health,
    drain: Option<Drain>,
    stop_workers: impl Fn(),
    stop_server: std::sync::Arc<tokio::sync::watch::Sender<bool>>,
) {
    crate::shutdown::signal_received().await;
    health.not_serving().await;
    // Workers and server keep going while draining: calls about what this replica
    // holds (and its own task queue's activities) must still be answered.
    if let Some(drain) = drain {
        drain.await;
    }
    stop_workers();
    let _ = stop_server.send(true);
}

/// Health follows the peers: NOT_SERVING while a peer setting's names resolve to no
/// replica (a wrong name, a peer not up yet), SERVING again once they do, until shutdown.
async fn follow_peers(health: Health, stop: tokio::sync::watch::Receiver<bool>, mut serving: bool) {
    loop {
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        if *stop.borrow() {
            return;
        }
        let waiting = crate::discovery::waiting_for();
        if waiting.is_empty() != serving {
            serving = waiting.is_empty();
            if serving {
                tracing::info!("every peer name resolves: serving");
                health.serving().await;
            } else {
                tracing::warn!(settings = ?waiting, "peer names resolve to no replica yet: not serving until they do (looked up again every FORKYARD_DISCOVERY_REFRESH_SECS)");
                health.not_serving().await;
            }
        }
    }
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

/// `run_with_worker` for several task queues served by one process.
pub async fn run_with_workers(
    svc: Service,
    client: temporalio_client::Client,
    options: Vec<temporalio_sdk::WorkerOptions>,
) -> anyhow::Result<()> {
    run_with_workers_draining(svc, client, options, None).await
}

/// [`run_with_workers`] that waits for `drain` after a shutdown signal (health already
/// NOT_SERVING) before it stops the workers and the server.
pub async fn run_with_workers_draining(
    svc: Service,
    client: temporalio_client::Client,
    options: Vec<temporalio_sdk::WorkerOptions>,
    drain: Option<Drain>,
) -> anyhow::Result<()> {
    let runtime = crate::temporal::runtime()?;
    let mut workers = Vec::with_capacity(options.len());
    for o in options {
        let (worker, stop) = crate::temporal::worker(&runtime, client.clone(), o)?;
        workers.push((worker, Box::new(stop) as StopWorker));
    }
    run_workers_draining(svc, workers, drain).await
}
