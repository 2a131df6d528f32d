//! A running fork's branch point (fork trees, #45): its last completed model turn.
//!
//! The gateway sees every request of a fork's agent; a request is the agent waiting on
//! its model, with the previous turn's tools run and its session written. So a capture
//! asked for (`CaptureBranchPoint`) is taken at the fork's next model request: that
//! request is held while the sandbox's workspace (the agent CLI's home inside it) is
//! snapshotted, then sent on. The agent only sees one slower answer. Captures asked for
//! at once share that one snapshot.

use crate::error::AgentError;
use forkyard_common::grpc_telemetry::TracedChannel as Channel;
use forkyard_proto::sandbox::v1::{
    PersistWorkspaceRequest, sandbox_provisioner_client::SandboxProvisionerClient,
};
use std::sync::Mutex;
use tokio::sync::oneshot;

/// Where a fork's sandbox is snapshotted: the provisioner replica owning it.
#[derive(Clone)]
pub struct Snapshotter {
    pub client: SandboxProvisionerClient<Channel>,
    pub endpoint: String,
    pub sandbox_id: String,
}

/// A captured branch point.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Point {
    pub snapshot_id: String,
    pub snapshot_endpoint: String,
    pub session: String,
    /// Model responses the fork had received when its next request was held.
    pub turn: u32,
}

type Waiter = oneshot::Sender<Result<Point, String>>;

/// A grant's side of captures: whom to ask for the snapshot, the agent's session as
/// far as the runner has read it, and who waits for the next turn.
#[derive(Default)]
pub struct Captures {
    snapshotter: Option<Snapshotter>,
    session: Mutex<String>,
    waiting: Mutex<Vec<Waiter>>,
}

impl Captures {
    pub fn new(snapshotter: Option<Snapshotter>) -> Self {
        Self {
            snapshotter,
            ..Self::default()
        }
    }

    /// The agent printed its session id (a CLI's first event).
    pub fn set_session(&self, session: &str) {
        session.clone_into(&mut self.session.lock().expect("session lock"));
    }

    /// Wait for the next turn's point: the receiver resolves with it, or with why it
    /// could not be taken; it is dropped (an error) when the agent ends first.
    pub fn ask(&self) -> Result<oneshot::Receiver<Result<Point, String>>, AgentError> {
        if self.snapshotter.is_none() {
            return Err(AgentError::BranchPoint {
                code: tonic::Code::FailedPrecondition,
                message: "the fork's sandbox cannot be snapshotted (it runs off the mesh's hosts)"
                    .into(),
            });
        }
        let (tx, rx) = oneshot::channel();
        self.waiting.lock().expect("captures lock").push(tx);
        Ok(rx)
    }

    /// A model request of the fork is about to go upstream, `turn` responses in: if a
    /// capture waits, snapshot the workspace first and answer it. The request waits
    /// for the snapshot, which is the point: the agent is idle while it is taken.
    pub async fn at_request(&self, turn: u32) {
        let waiting: Vec<Waiter> = {
            let mut w = self.waiting.lock().expect("captures lock");
            w.retain(|tx| !tx.is_closed());
            std::mem::take(&mut *w)
        };
        let Some(snap) = self.snapshotter.as_ref().filter(|_| !waiting.is_empty()) else {
            return;
        };
        let persisted = snap
            .client
            .clone()
            .persist_workspace(PersistWorkspaceRequest {
                sandbox_id: snap.sandbox_id.clone(),
            })
            .await;
        let point = match persisted {
            Ok(r) => Ok(Point {
                snapshot_id: r.into_inner().snapshot_id,
                snapshot_endpoint: snap.endpoint.clone(),
                session: self.session.lock().expect("session lock").clone(),
                turn,
            }),
            Err(s) => Err(format!(
                "the workspace could not be snapshotted: {}",
                s.message()
            )),
        };
        tracing::info!(sandbox_id = %snap.sandbox_id, turn, point = ?point.as_ref().map(|p| &p.snapshot_id), "branch point captured at a held model request");
        for tx in waiting {
            let _ = tx.send(point.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A snapshotter whose provisioner cannot be reached.
    fn unreachable() -> Snapshotter {
        let ep = tonic::transport::Endpoint::from_static("http://127.0.0.1:1");
        Snapshotter {
            client: SandboxProvisionerClient::new(forkyard_common::grpc_telemetry::traced_channel(
                ep.connect_lazy(),
            )),
            endpoint: "http://127.0.0.1:1".into(),
            sandbox_id: "sbx-1".into(),
        }
    }

    #[tokio::test]
    async fn captures_asked_at_once_share_the_next_request_and_an_ended_agent_answers_none() {
        let c = Captures::new(Some(unreachable()));
        // A request with nobody waiting goes straight on.
        c.at_request(1).await;
        let (a, b) = (c.ask().unwrap(), c.ask().unwrap());
        c.at_request(2).await;
        for answer in [a.await.unwrap(), b.await.unwrap()] {
            let why = answer.unwrap_err();
            assert!(
                why.starts_with("the workspace could not be snapshotted"),
                "{why}"
            );
        }
        // The agent ends (its grant goes) before its next request: the waiter hears so.
        let waiting = c.ask().unwrap();
        drop(c);
        assert!(waiting.await.is_err());
        // A sandbox off the mesh's hosts has no snapshots of ours.
        let remote = Captures::new(None).ask().unwrap_err();
        assert!(
            remote.to_string().contains("cannot be snapshotted"),
            "{remote}"
        );
    }
}
