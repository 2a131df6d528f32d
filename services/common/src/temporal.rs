//! Connecting to Temporal and running a worker beside the gRPC server.

use crate::config::TemporalArgs;
use std::time::{Duration, Instant};
use temporalio_client::{Client, ClientOptions, Connection, ConnectionOptions};
use temporalio_sdk::{Runtime, Worker, WorkerOptions};

/// Connect to the Temporal frontend, retrying while it is not up yet (services and the
/// dev server start together) until `connect_timeout_secs` has passed.
pub async fn connect(args: &TemporalArgs, identity: &str) -> anyhow::Result<Client> {
    let url = args.url().map_err(anyhow::Error::msg)?;
    let deadline = Instant::now() + Duration::from_secs(args.connect_timeout_secs);
    let mut delay = Duration::from_millis(100);
    loop {
        let opts = ConnectionOptions::new(url.clone())
            .identity(identity.to_owned())
            .build();
        match Connection::connect(opts).await {
            Ok(conn) => {
                let client = Client::new(conn, ClientOptions::new(args.namespace.clone()).build())?;
                return Ok(client);
            }
            Err(e) if Instant::now() < deadline => {
                tracing::debug!(error = %e, address = %url, "temporal not reachable yet, retrying");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(2));
            }
            Err(e) => {
                anyhow::bail!("cannot connect to temporal at {url} (TEMPORAL_ADDRESS): {e}")
            }
        }
    }
}

/// The SDK runtime on the current tokio runtime.
pub fn runtime() -> anyhow::Result<Runtime> {
    Ok(Runtime::from_current_tokio(Default::default())?)
}

/// Build a worker and return it with a handle that starts its graceful shutdown.
/// `Worker::run` is not `Send`: the caller runs it on its main task.
pub fn worker(
    runtime: &Runtime,
    client: Client,
    options: WorkerOptions,
) -> anyhow::Result<(Worker, impl Fn() + Send + Sync + 'static)> {
    let worker = Worker::new(runtime, client, options)?;
    let handle = worker.shutdown_handle();
    Ok((worker, handle))
}
