//! A running fork's branch point (fork trees, #45): its last completed model turn.
//!
//! The gateway sees every request of a fork's agent; a request is the agent waiting on
//! its model, with the previous turn's tools run and its session written. So a capture
//! asked for (`CaptureBranchPoint`) is taken at the fork's next model request: that
//! request is held while the sandbox's workspace (the agent CLI's home inside it) is
//! snapshotted, then sent on. The agent only sees one slower answer. Captures asked for
//! at once share that one snapshot.
//!
//! A CLI writes its session file behind its requests (Claude Code batches its writes),
//! so the held request can be ahead of the file: the snapshot waits until the agent's
//! home holds the request's last tool result (its id), which the agent, idle, writes
//! within moments. Without that, a branch would lose the last turn's conversation while
//! its workspace holds the turn's edits.

use crate::error::AgentError;
use forkyard_common::grpc_telemetry::TracedChannel as Channel;
use forkyard_proto::sandbox::v1::ExecRequest;
use forkyard_proto::sandbox::v1::{
    PersistWorkspaceRequest, sandbox_provisioner_client::SandboxProvisionerClient,
};
use serde_json::Value;
use std::{sync::Mutex, time::Duration};
use tokio::sync::oneshot;

/// How long a snapshot waits for the agent's session file to catch up with its request.
const FLUSH_WAIT: Duration = Duration::from_secs(5);

/// Where a fork's sandbox is snapshotted: the provisioner replica owning it.
#[derive(Clone)]
pub struct Snapshotter {
    pub client: SandboxProvisionerClient<Channel>,
    pub endpoint: String,
    pub sandbox_id: String,
    /// The agent CLI's home in the sandbox, where its session file is written (none: an
    /// agent whose conversation the runner keeps itself, or a plain command).
    pub home: Option<&'static str>,
}

impl Snapshotter {
    /// Where `req`'s sandbox is snapshotted, through `client` at `endpoint` (its owner);
    /// none for a sandbox off the mesh's hosts (E2B keeps no snapshots of ours). The
    /// agent CLI's home is waited on when the driver is one (`crate::branch::home`).
    pub fn of(
        req: &forkyard_proto::agent::v1::RunAgentRequest,
        client: &SandboxProvisionerClient<Channel>,
        endpoint: &str,
    ) -> Option<Self> {
        (!forkyard_proto::remote_sandbox(&req.sandbox_id)).then(|| Self {
            client: client.clone(),
            endpoint: endpoint.to_owned(),
            sandbox_id: req.sandbox_id.clone(),
            home: crate::branch::home(req),
        })
    }
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

    /// Whether a capture waits for the next turn.
    pub fn asked(&self) -> bool {
        let mut w = self.waiting.lock().expect("captures lock");
        w.retain(|tx| !tx.is_closed());
        !w.is_empty()
    }

    /// A model request of the fork is about to go upstream, `turn` responses in: if a
    /// capture waits, snapshot the workspace first and answer it. The request waits
    /// for the snapshot, which is the point: the agent is idle while it is taken.
    /// `turn` is read only then: most requests go on with nothing more done.
    pub async fn at_request(&self, turn: impl FnOnce() -> u32, body: &[u8]) {
        if !self.asked() {
            return;
        }
        let turn = turn();
        let (Some(snap), Some(id)) = (self.snapshotter.as_ref(), last_tool_result(body)) else {
            return self.take_point(turn, async {}).await;
        };
        self.take_point(turn, written(snap, id)).await;
    }

    /// [`Self::at_request`], once `before` has put what the snapshot must hold in the
    /// workspace (the built-in loops' conversation, which lives in the runner).
    pub async fn take_point(&self, turn: u32, before: impl std::future::Future<Output = ()>) {
        let waiting: Vec<Waiter> = {
            let mut w = self.waiting.lock().expect("captures lock");
            w.retain(|tx| !tx.is_closed());
            std::mem::take(&mut *w)
        };
        let Some(snap) = self.snapshotter.as_ref().filter(|_| !waiting.is_empty()) else {
            return;
        };
        before.await;
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

/// The id of the last tool result `body` (a model request) hands back: Messages'
/// `tool_use_id`, Responses' `call_id`, Chat Completions' `tool_call_id`. Only plain
/// ids (they are searched for in the sandbox).
fn last_tool_result(body: &[u8]) -> Option<String> {
    let v: Value = serde_json::from_slice(body).ok()?;
    let none = Vec::new();
    let items = v["messages"]
        .as_array()
        .or_else(|| v["input"].as_array())
        .unwrap_or(&none);
    let id = items.iter().rev().find_map(|m| {
        let blocks = m["content"].as_array().unwrap_or(&none);
        let block = blocks.iter().rev().find(|b| b["type"] == "tool_result");
        block
            .and_then(|b| b["tool_use_id"].as_str())
            .or_else(|| {
                matches!(
                    m["type"].as_str(),
                    Some("function_call_output" | "custom_tool_call_output")
                )
                .then(|| m["call_id"].as_str())
                .flatten()
            })
            .or_else(|| {
                (m["role"] == "tool")
                    .then(|| m["tool_call_id"].as_str())
                    .flatten()
            })
    })?;
    let plain = !id.is_empty()
        && id.len() <= 128
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    plain.then(|| id.to_owned())
}

/// Wait (up to [`FLUSH_WAIT`]) until the agent's home in the sandbox holds the tool
/// result `id`: a line (the CLIs' session files are JSON lines) naming it with a tool
/// result's type (Claude Code's `tool_result`, Codex's `function_call_output`), not
/// only the tool call that carries the same id and was written a turn earlier.
async fn written(snap: &Snapshotter, id: String) {
    let Some(home) = snap.home else { return };
    let pattern = ["tool_result", "function_call_output"]
        .map(|kind| format!("{kind}.*\"{id}\"|\"{id}\".*{kind}"))
        .join("|");
    let grep = ExecRequest {
        sandbox_id: snap.sandbox_id.clone(),
        argv: ["grep", "-rqE", "--", &pattern, home]
            .map(str::to_owned)
            .into(),
        timeout_secs: 5,
        ..Default::default()
    };
    let started = std::time::Instant::now();
    while started.elapsed() < FLUSH_WAIT {
        match snap.client.clone().exec(grep.clone()).await {
            Ok(r) if r.get_ref().exit_code == 0 => return,
            Ok(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            Err(_) => return,
        }
    }
    tracing::warn!(sandbox_id = %snap.sandbox_id, tool_result = %id, "the agent's session file did not catch up with its request; snapshotting as it is");
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
            home: None,
        }
    }

    #[tokio::test]
    async fn captures_asked_at_once_share_the_next_request_and_an_ended_agent_answers_none() {
        let c = Captures::new(Some(unreachable()));
        // A request with nobody waiting goes straight on.
        c.at_request(|| 1, b"{}").await;
        let (a, b) = (c.ask().unwrap(), c.ask().unwrap());
        c.at_request(|| 2, b"{}").await;
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

    #[test]
    fn the_last_tool_result_is_found_in_each_api() {
        let messages = br#"{"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1"}]},{"role":"assistant","content":[]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_2"},{"type":"text","text":"x"}]}]}"#;
        assert_eq!(last_tool_result(messages).as_deref(), Some("toolu_2"));
        let responses = br#"{"input":[{"type":"function_call_output","call_id":"call_7","output":"ok"},{"type":"message","role":"user","content":[]}]}"#;
        assert_eq!(last_tool_result(responses).as_deref(), Some("call_7"));
        let chat = br#"{"messages":[{"role":"tool","tool_call_id":"call-3","content":"ok"}]}"#;
        assert_eq!(last_tool_result(chat).as_deref(), Some("call-3"));
        // A first request, and an id that is no plain word: nothing to wait for.
        assert_eq!(
            last_tool_result(br#"{"messages":[{"role":"user","content":"hi"}]}"#),
            None
        );
        let odd = br#"{"messages":[{"role":"tool","tool_call_id":"a b; rm","content":""}]}"#;
        assert_eq!(last_tool_result(odd), None);
    }
}
