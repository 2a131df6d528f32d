//! Where the sandboxes are: every provisioner replica's gRPC API (or a fake in tests).

use crate::error::JanitorError;
use forkyard_common::{
    discovery,
    grpc_telemetry::{TracedChannel, traced_channel},
};
use forkyard_proto::sandbox::v1::{
    DeleteSnapshotRequest, DestroySandboxRequest, ListSandboxesRequest, ListSnapshotsRequest,
    Sandbox, SnapshotInfo, sandbox_provisioner_client::SandboxProvisionerClient,
};
use std::{
    collections::HashMap,
    future::Future,
    sync::{Arc, Mutex, PoisonError},
};

/// Where the sandboxes are: the provisioner's gRPC API, or a fake in tests.
pub trait Sandboxes: Send + Sync + 'static {
    fn list(&self) -> impl Future<Output = Result<Vec<Sandbox>, JanitorError>> + Send;
    fn destroy(
        &self,
        sandbox_id: &str,
        reason: &str,
    ) -> impl Future<Output = Result<(), JanitorError>> + Send;
    /// The workspace snapshots kept (fork trees' branch points); none where there are
    /// no snapshots.
    fn list_snapshots(
        &self,
    ) -> impl Future<Output = Result<Vec<SnapshotInfo>, JanitorError>> + Send {
        async { Ok(Vec::new()) }
    }
    fn delete_snapshot(
        &self,
        snapshot_id: &str,
    ) -> impl Future<Output = Result<(), JanitorError>> + Send {
        let _ = snapshot_id;
        async { Ok(()) }
    }
}

type ProvisionerClient = SandboxProvisionerClient<TracedChannel>;

/// Every provisioner replica through its gRPC API: each sweep looks the configured
/// names up again and lists every replica they resolve to (a headless Service or a
/// Compose service name resolves to all of them); a sandbox is destroyed at the
/// replica that listed it.
#[derive(Clone)]
pub struct GrpcSandboxes {
    targets: Vec<discovery::Target>,
    state: Arc<Mutex<ReplicaState>>,
}

#[derive(Default)]
struct ReplicaState {
    /// One lazily connected client per replica URL seen.
    clients: HashMap<String, ProvisionerClient>,
    /// Sandbox id → the replica URL that listed it last.
    owners: HashMap<String, String>,
    /// Snapshot id → the replica URL that listed it last.
    snapshot_owners: HashMap<String, String>,
}

impl GrpcSandboxes {
    /// Clients for the replicas of `addrs` (e.g. `http://sandbox-provisioner:50052`),
    /// connected on first use, so the janitor starts while the provisioner is down.
    pub fn connect_lazy(addrs: &str) -> Result<Self, JanitorError> {
        let targets = discovery::parse("provisioner_addr", addrs).map_err(|reason| {
            JanitorError::InvalidArgument {
                field: "provisioner_addr",
                reason,
            }
        })?;
        Ok(Self {
            targets,
            state: Arc::default(),
        })
    }

    fn client(&self, replica: &discovery::Replica) -> Result<ProvisionerClient, JanitorError> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(c) = state.clients.get(&replica.url) {
            return Ok(c.clone());
        }
        let ep = discovery::endpoint(replica).map_err(|reason| JanitorError::InvalidArgument {
            field: "provisioner_addr",
            reason,
        })?;
        let client = SandboxProvisionerClient::new(traced_channel(
            ep.timeout(forkyard_common::tls::SHORT_CALL_DEADLINE)
                .connect_lazy(),
        ));
        state.clients.insert(replica.url.clone(), client.clone());
        Ok(client)
    }
}

impl Sandboxes for GrpcSandboxes {
    /// Every reachable replica's sandboxes; an error only when none answered (a replica
    /// that cannot be asked now is swept next time, and logged).
    async fn list(&self) -> Result<Vec<Sandbox>, JanitorError> {
        let (replicas, lookup_errors) = discovery::replicas(&self.targets).await;
        for e in &lookup_errors {
            tracing::warn!(setting = "FORKYARD_PROVISIONER_ADDR", error = %e, "provisioner lookup failed");
        }
        let mut all = Vec::new();
        let mut owners = HashMap::new();
        let mut last_error = lookup_errors
            .into_iter()
            .next()
            .map(JanitorError::ProvisionerUnavailable);
        let mut answered = 0;
        for replica in &replicas {
            let listed = self
                .client(replica)?
                .list_sandboxes(ListSandboxesRequest::default())
                .await;
            match listed {
                Ok(resp) => {
                    answered += 1;
                    for s in resp.into_inner().sandboxes {
                        owners.insert(s.id.clone(), replica.url.clone());
                        all.push(s);
                    }
                }
                Err(status) => {
                    tracing::warn!(replica = %replica.url, error = %status.message(), "provisioner replica did not list its sandboxes");
                    last_error = Some(JanitorError::from_provisioner(status));
                }
            }
        }
        if answered == 0 {
            return Err(last_error.unwrap_or_else(|| {
                JanitorError::ProvisionerUnavailable("no provisioner replica resolved".into())
            }));
        }
        self.state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .owners = owners;
        Ok(all)
    }

    async fn destroy(&self, sandbox_id: &str, reason: &str) -> Result<(), JanitorError> {
        let client = {
            let state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
            state
                .owners
                .get(sandbox_id)
                .and_then(|url| state.clients.get(url))
                .cloned()
        };
        let Some(mut client) = client else {
            return Err(JanitorError::Provisioner(tonic::Status::not_found(
                format!("sandbox {sandbox_id} was not listed by any provisioner replica"),
            )));
        };
        let req = DestroySandboxRequest {
            sandbox_id: sandbox_id.to_owned(),
            reason: reason.to_owned(),
        };
        client
            .destroy_sandbox(req)
            .await
            .map_err(JanitorError::from_provisioner)?;
        Ok(())
    }

    /// Every reachable replica's snapshots; a replica that cannot be asked now is
    /// swept next time (its snapshots stay, as they would anyway).
    async fn list_snapshots(&self) -> Result<Vec<SnapshotInfo>, JanitorError> {
        let (replicas, _) = discovery::replicas(&self.targets).await;
        let (mut all, mut owners) = (Vec::new(), HashMap::new());
        for replica in &replicas {
            let listed = self
                .client(replica)?
                .list_snapshots(ListSnapshotsRequest::default())
                .await;
            match listed {
                Ok(resp) => {
                    for s in resp.into_inner().snapshots {
                        owners.insert(s.id.clone(), replica.url.clone());
                        all.push(s);
                    }
                }
                Err(status) => {
                    tracing::warn!(replica = %replica.url, error = %status.message(), "provisioner replica did not list its snapshots");
                }
            }
        }
        self.state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .snapshot_owners = owners;
        Ok(all)
    }

    async fn delete_snapshot(&self, snapshot_id: &str) -> Result<(), JanitorError> {
        let client = {
            let state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
            state
                .snapshot_owners
                .get(snapshot_id)
                .and_then(|url| state.clients.get(url))
                .cloned()
        };
        let Some(mut client) = client else {
            return Err(JanitorError::Provisioner(tonic::Status::not_found(
                format!("snapshot {snapshot_id} was not listed by any provisioner replica"),
            )));
        };
        let req = DeleteSnapshotRequest {
            snapshot_id: snapshot_id.to_owned(),
        };
        client
            .delete_snapshot(req)
            .await
            .map_err(JanitorError::from_provisioner)?;
        Ok(())
    }
}
