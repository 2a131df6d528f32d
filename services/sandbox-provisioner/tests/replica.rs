//! A replica's identity on its sandboxes: `owner_endpoint` and `owner_task_queue` come
//! from the replica that owns the sandbox now, also after a restart under a new id.

mod common;

use common::make_repo;
use forkyard_proto::sandbox::v1::CreateSandboxRequest;
use forkyard_sandbox_provisioner::{Config, Provisioner, config::replica_task_queue};
use std::{path::Path, sync::Arc};

async fn replica(state: &Path, endpoint: &str, id: &str) -> Arc<Provisioner> {
    let mut config = Config::new(state, endpoint);
    config.owner_task_queue = replica_task_queue(id);
    Provisioner::open(config).await.expect("open provisioner")
}

#[tokio::test]
async fn sandboxes_name_their_owner_replica_and_its_task_queue() {
    let tmp = common::let_through(tempfile::tempdir().unwrap());
    let repo = make_repo(tmp.path());
    let state = tmp.path().join("state");
    let a = replica(&state, "http://10.0.0.1:50052", "host-a").await;
    assert_eq!(a.owner_task_queue(), "sandbox-provisioner/host-a");
    let sbx = a
        .create(CreateSandboxRequest {
            repo: repo.display().to_string(),
            branch: "forkyard-fork-1".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(sbx.owner_endpoint, "http://10.0.0.1:50052");
    assert_eq!(sbx.owner_task_queue, "sandbox-provisioner/host-a");
    assert_eq!(
        a.get(&sbx.id).unwrap().owner_task_queue,
        sbx.owner_task_queue
    );
    drop(a);

    // The same state dir taken over by a replica with another address and id: it owns
    // the sandbox now, so calls must go to it.
    let b = replica(&state, "http://10.0.0.2:50052", "host-b").await;
    let adopted = b.get(&sbx.id).unwrap();
    assert_eq!(adopted.owner_endpoint, "http://10.0.0.2:50052");
    assert_eq!(adopted.owner_task_queue, "sandbox-provisioner/host-b");
}
