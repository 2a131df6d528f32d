//! What most run-API tests start from: a mesh, a repository to fork and a gateway client.

use crate::{mesh::Mesh, repo, support::Gateway};
use forkyard_proto::{common::v1::ForkStatus, gateway::v1::Run};
use std::time::Duration;

/// How long a test waits on a small run to get somewhere before it fails.
pub const LONG: Duration = Duration::from_secs(120);

pub async fn setup() -> (Mesh, tempfile::TempDir, Gateway) {
    let mesh = Mesh::start().await.expect("mesh starts");
    let src = tempfile::tempdir().unwrap();
    repo::create(src.path()).unwrap();
    let gw = Gateway::new(mesh.channel("gateway").await.unwrap());
    (mesh, src, gw)
}

/// Fork `fork`'s status in `run` (forks are numbered from 1).
pub fn status_of(run: &Run, fork: u32) -> ForkStatus {
    ForkStatus::try_from(run.forks[fork as usize - 1].status).unwrap()
}
