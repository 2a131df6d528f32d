//! WatchRun: progress events derived by looking at the run and its running forks
//! (their `progress` query, and the agent activity's heartbeat details from Temporal's
//! description), so progress never adds events to the run's history.

use super::GatewayService;
use crate::{
    auth::Tenant,
    error::GatewayError,
    workflows::{ForkWorkflow, SandboxOrchestrationWorkflow, phase},
};
use forkyard_proto::{
    agent::v1::AgentProgress,
    common::v1::{ForkResult, ForkStatus},
    gateway::v1::{Run, RunEvent, RunState, run_event::Kind},
};
use std::{collections::HashMap, pin::Pin};
use temporalio_client::{WorkflowDescribeOptions, WorkflowQueryOptions};
use tokio::sync::mpsc;
use tonic::Status;

type EventStream = Pin<Box<dyn futures::Stream<Item = Result<RunEvent, Status>> + Send>>;

use forkyard_common::clock::now_ms;

fn closed(state: i32) -> bool {
    ![
        RunState::Running as i32,
        RunState::Paused as i32,
        RunState::AwaitingBudget as i32,
    ]
    .contains(&state)
}

fn event(kind: Kind, run_id: &str, state: i32) -> RunEvent {
    RunEvent {
        kind: kind as i32,
        run_id: run_id.to_owned(),
        state,
        unix_ms: now_ms(),
        ..Default::default()
    }
}

/// What the watcher last told the client about one fork.
#[derive(Default, Clone, PartialEq)]
struct Seen {
    status: i32,
    sandbox_ready: bool,
    /// The agent heartbeat last reported (None: none yet).
    agent_elapsed_ms: Option<u64>,
}

/// The client went away: the watch ends.
struct Gone;

/// One watch: where its events go, and what the client was last told.
struct Watcher<'a> {
    run_id: &'a str,
    tx: &'a mpsc::Sender<Result<RunEvent, Status>>,
    seen: HashMap<u32, Seen>,
    /// The run's state the client was last told.
    state: i32,
    /// The run's budget the client was last told (a raise changes no state).
    budget_micros: i64,
}

impl Watcher<'_> {
    async fn send(&self, e: RunEvent) -> Result<(), Gone> {
        self.tx.send(Ok(e)).await.map_err(|_| Gone)
    }

    /// A running fork's news: started, its sandbox ready, its agent's latest heartbeat.
    /// What the client knows of it then.
    async fn tell_running(
        &self,
        before: &Seen,
        state: i32,
        view: &ForkResult,
        progress: Option<AgentProgress>,
    ) -> Result<Seen, Gone> {
        let run_id = self.run_id;
        let mut now = Seen {
            status: ForkStatus::Running as i32,
            ..before.clone()
        };
        if before.status == ForkStatus::Pending as i32 {
            self.send(fork_event(Kind::ForkStarted, run_id, state, view))
                .await?;
        }
        now.sandbox_ready = view.sandbox_ready_unix_ms > 0;
        if now.sandbox_ready && !before.sandbox_ready {
            self.send(fork_event(Kind::SandboxReady, run_id, state, view))
                .await?;
        }
        if let Some(p) = progress
            && Some(p.elapsed_ms) != before.agent_elapsed_ms
        {
            now.agent_elapsed_ms = Some(p.elapsed_ms);
            let mut e = fork_event(Kind::AgentProgress, run_id, state, view);
            e.agent_elapsed_ms = p.elapsed_ms;
            e.agent_turns = p.turns;
            e.agent_cost_micros = p.cost_micros;
            e.agent_last_action = p.last_action;
            e.agent_usage = p.usage;
            self.send(e).await?;
        }
        Ok(now)
    }

    /// A run still going whose state changed (paused, resumed, awaiting budget) or whose
    /// budget was raised.
    async fn tell_state(&mut self, run: &Run) -> Result<(), Gone> {
        if run.state != self.state || run.budget_micros != self.budget_micros {
            self.state = run.state;
            self.budget_micros = run.budget_micros;
            let mut e = event(Kind::RunStateChanged, self.run_id, self.state);
            e.run = Some(run.clone());
            self.send(e).await?;
        }
        Ok(())
    }
}

/// A fork not running now finished since the last look: it was running, or it started
/// and finished between two looks (or was cancelled while pending).
fn finished_since(before: i32, now: i32) -> bool {
    let was_open = before == ForkStatus::Running as i32 || before == ForkStatus::Pending as i32;
    was_open && now != ForkStatus::Pending as i32
}

impl GatewayService {
    pub(super) async fn watch(
        &self,
        tenant: Tenant,
        run_id: String,
    ) -> Result<EventStream, GatewayError> {
        let first = self.run(&tenant, &run_id).await?;
        let (tx, rx) = mpsc::channel(256);
        let svc = self.clone();
        tokio::spawn(async move {
            if let Err(status) = svc.watch_loop(&tenant, &run_id, first, &tx).await {
                let _ = tx.send(Err(status)).await;
            }
        });
        Ok(Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx)))
    }

    async fn watch_loop(
        &self,
        tenant: &Tenant,
        run_id: &str,
        first: Run,
        tx: &mpsc::Sender<Result<RunEvent, Status>>,
    ) -> Result<(), Status> {
        let mut watcher = Watcher {
            run_id,
            tx,
            seen: HashMap::new(),
            state: first.state,
            budget_micros: first.budget_micros,
        };
        let mut snapshot = event(Kind::Snapshot, run_id, first.state);
        snapshot.run = Some(first.clone());
        if watcher.send(snapshot).await.is_err() {
            return Ok(());
        }
        let mut run = first;
        // Temporal says when the run closes (a long poll on its history's close event),
        // so the final event goes out then, not at the next look: a look every
        // `watch_interval` at a view up to a few `live_ttl` old ended a watch about a
        // second after its run.
        let close = self.run_closes(run_id);
        tokio::pin!(close);
        let mut closing = !closed(run.state);
        loop {
            if self.tell_forks(&mut watcher, &run).await.is_err() {
                return Ok(());
            }
            if closed(run.state) {
                let mut e = event(Kind::RunFinished, run_id, run.state);
                e.run = Some(run);
                let _ = watcher.send(e).await;
                return Ok(());
            }
            if watcher.tell_state(&run).await.is_err() {
                return Ok(());
            }
            tokio::select! {
                () = tokio::time::sleep(self.watch_interval) => {}
                () = tx.closed() => return Ok(()),
                () = &mut close, if closing => {
                    // The view kept of the running run is stale now: read it afresh.
                    closing = false;
                    self.reads.forget(run_id);
                }
            }
            run = self.run(tenant, run_id).await.map_err(Status::from)?;
        }
    }

    /// Returns when the run's workflow has closed, however it ended (or is not there). A
    /// Temporal that does not answer is asked again after a pause, never in a spin.
    async fn run_closes(&self, run_id: &str) {
        use temporalio_client::{WorkflowGetResultOptions, errors::WorkflowGetResultError as E};
        while let Err(E::Rpc(_) | E::Other(_)) = self
            .handle(run_id)
            .get_result(WorkflowGetResultOptions::default())
            .await
        {
            tokio::time::sleep(self.watch_interval * 4).await;
        }
    }

    /// Tell the client what changed of each fork since the last look.
    async fn tell_forks(&self, watcher: &mut Watcher<'_>, run: &Run) -> Result<(), Gone> {
        let run_id = watcher.run_id;
        let inline = run.spec.as_ref().is_some_and(|s| s.inline_forks);
        let mut heartbeats = if inline
            && run
                .forks
                .iter()
                .any(|f| f.status == ForkStatus::Running as i32 && f.phase == phase::AGENT)
        {
            self.inline_agents(run_id).await
        } else {
            HashMap::new()
        };
        for f in &run.forks {
            let before = watcher.seen.get(&f.fork).cloned().unwrap_or(Seen {
                status: ForkStatus::Pending as i32,
                ..Default::default()
            });
            let now = if f.status == ForkStatus::Running as i32 {
                // An inline fork's view is the run's; a child's is its own.
                let live = if inline {
                    None
                } else {
                    self.fork_live(run_id, f.fork).await
                };
                let (view, progress) =
                    live.unwrap_or_else(|| (f.clone(), heartbeats.remove(&f.fork)));
                watcher
                    .tell_running(&before, run.state, &view, progress)
                    .await?
            } else {
                if finished_since(before.status, f.status) {
                    watcher
                        .send(fork_event(Kind::ForkFinished, run_id, run.state, f))
                        .await?;
                }
                Seen {
                    status: f.status,
                    ..before
                }
            };
            watcher.seen.insert(f.fork, now);
        }
        Ok(())
    }

    /// The last heartbeat of each inline fork's running agent, from the run's pending
    /// activities (ids `fork-<n>/a<attempt>/agent`): one call for all of them.
    pub(super) async fn inline_agents(&self, run_id: &str) -> HashMap<u32, AgentProgress> {
        let run = self
            .client
            .get_workflow_handle::<SandboxOrchestrationWorkflow>(run_id);
        let Ok(desc) = run.describe(WorkflowDescribeOptions::default()).await else {
            return HashMap::new();
        };
        desc.raw_description
            .pending_activities
            .iter()
            .filter_map(|a| {
                let fork = a
                    .activity_id
                    .strip_prefix("fork-")?
                    .split_once('/')
                    .filter(|(_, rest)| rest.ends_with("/agent"))?
                    .0
                    .parse()
                    .ok()?;
                let p = a.heartbeat_details.as_ref()?.payloads.first()?;
                Some((fork, serde_json::from_slice::<AgentProgress>(&p.data).ok()?))
            })
            .collect()
    }

    /// A running fork's own view (phase, sandbox readiness) and its agent's last heartbeat.
    pub(super) async fn fork_live(
        &self,
        run_id: &str,
        fork: u32,
    ) -> Option<(ForkResult, Option<AgentProgress>)> {
        let child = self.client.get_workflow_handle::<ForkWorkflow>(
            forkyard_proto::ids::ForkId::new(run_id, fork).to_string(),
        );
        let view = child
            .query(ForkWorkflow::progress, (), WorkflowQueryOptions::default())
            .await
            .ok()?;
        if view.phase != phase::AGENT {
            return Some((view, None));
        }
        let desc = child
            .describe(WorkflowDescribeOptions::default())
            .await
            .ok()?;
        let progress = desc
            .raw_description
            .pending_activities
            .iter()
            .filter(|a| {
                a.activity_type
                    .as_ref()
                    .is_some_and(|t| t.name == "agent.run")
            })
            .find_map(|a| a.heartbeat_details.as_ref()?.payloads.first())
            .and_then(|p| serde_json::from_slice::<AgentProgress>(&p.data).ok());
        Some((view, progress))
    }
}

fn fork_event(kind: Kind, run_id: &str, state: i32, f: &ForkResult) -> RunEvent {
    let mut e = event(kind, run_id, state);
    e.fork = f.fork;
    let mut compact = f.clone();
    compact.patch.clear();
    compact.agent_output_tail.clear();
    compact.verify_output_tail.clear();
    e.fork_result = Some(compact);
    e
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `tell_state` sends for `run` after the client was told `state` and `budget`.
    async fn told(state: RunState, budget: i64, run: &Run) -> Vec<RunEvent> {
        let (tx, mut rx) = mpsc::channel(8);
        let mut w = Watcher {
            run_id: "run-1",
            tx: &tx,
            seen: HashMap::new(),
            state: state as i32,
            budget_micros: budget,
        };
        assert!(w.tell_state(run).await.is_ok());
        drop(tx);
        let mut out = Vec::new();
        while let Some(Ok(e)) = rx.recv().await {
            out.push(e);
        }
        out
    }

    #[tokio::test]
    async fn a_raised_budget_is_told_though_the_state_did_not_change() {
        let run = Run {
            state: RunState::Running as i32,
            budget_micros: 3_000_000,
            ..Default::default()
        };
        let events = told(RunState::Running, 1_000_000, &run).await;
        assert_eq!(events.len(), 1, "{events:?}");
        assert_eq!(events[0].kind, Kind::RunStateChanged as i32);
        assert_eq!(events[0].run.as_ref().unwrap().budget_micros, 3_000_000);
        assert!(told(RunState::Running, 3_000_000, &run).await.is_empty());
        let paused = Run {
            state: RunState::Paused as i32,
            ..run
        };
        assert_eq!(told(RunState::Running, 3_000_000, &paused).await.len(), 1);
    }
}
