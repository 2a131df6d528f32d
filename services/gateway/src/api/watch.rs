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
        let send = |e: RunEvent| async move { tx.send(Ok(e)).await.is_ok() };
        let mut seen: HashMap<u32, Seen> = HashMap::new();
        let mut state = first.state;
        let mut snapshot = event(Kind::Snapshot, run_id, state);
        snapshot.run = Some(first.clone());
        if !send(snapshot).await {
            return Ok(());
        }
        let mut run = first;
        loop {
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
                let mut now = Seen {
                    status: f.status,
                    ..seen.get(&f.fork).cloned().unwrap_or_default()
                };
                let before = seen.get(&f.fork).cloned().unwrap_or(Seen {
                    status: ForkStatus::Pending as i32,
                    ..Default::default()
                });
                if f.status == ForkStatus::Running as i32 {
                    // An inline fork's view is the run's; a child's is its own.
                    let live = if inline {
                        None
                    } else {
                        self.fork_live(run_id, f.fork).await
                    };
                    let (view, progress) =
                        live.unwrap_or_else(|| (f.clone(), heartbeats.remove(&f.fork)));
                    if before.status == ForkStatus::Pending as i32
                        && !send(fork_event(Kind::ForkStarted, run_id, run.state, &view)).await
                    {
                        return Ok(());
                    }
                    now.sandbox_ready = view.sandbox_ready_unix_ms > 0;
                    if now.sandbox_ready
                        && !before.sandbox_ready
                        && !send(fork_event(Kind::SandboxReady, run_id, run.state, &view)).await
                    {
                        return Ok(());
                    }
                    if let Some(p) = progress
                        && Some(p.elapsed_ms) != before.agent_elapsed_ms
                    {
                        now.agent_elapsed_ms = Some(p.elapsed_ms);
                        let mut e = fork_event(Kind::AgentProgress, run_id, run.state, &view);
                        e.agent_elapsed_ms = p.elapsed_ms;
                        e.agent_turns = p.turns;
                        e.agent_cost_micros = p.cost_micros;
                        e.agent_last_action = p.last_action;
                        e.agent_usage = p.usage;
                        if !send(e).await {
                            return Ok(());
                        }
                    }
                } else if before.status == ForkStatus::Running as i32
                    && f.status != ForkStatus::Pending as i32
                {
                    if !send(fork_event(Kind::ForkFinished, run_id, run.state, f)).await {
                        return Ok(());
                    }
                } else if before.status == ForkStatus::Pending as i32
                    && f.status != ForkStatus::Pending as i32
                {
                    // Started and finished between two looks (or cancelled while pending).
                    if !send(fork_event(Kind::ForkFinished, run_id, run.state, f)).await {
                        return Ok(());
                    }
                }
                seen.insert(f.fork, now);
            }
            if closed(run.state) {
                let mut e = event(Kind::RunFinished, run_id, run.state);
                e.run = Some(run);
                let _ = send(e).await;
                return Ok(());
            }
            if run.state != state {
                state = run.state;
                let mut e = event(Kind::RunStateChanged, run_id, state);
                e.run = Some(run.clone());
                if !send(e).await {
                    return Ok(());
                }
            }
            tokio::select! {
                () = tokio::time::sleep(self.watch_interval) => {}
                () = tx.closed() => return Ok(()),
            }
            run = self.run(tenant, run_id).await.map_err(Status::from)?;
        }
    }

    /// The last heartbeat of each inline fork's running agent, from the run's pending
    /// activities (ids `fork-<n>/a<attempt>/agent`): one call for all of them.
    async fn inline_agents(&self, run_id: &str) -> HashMap<u32, AgentProgress> {
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
    async fn fork_live(
        &self,
        run_id: &str,
        fork: u32,
    ) -> Option<(ForkResult, Option<AgentProgress>)> {
        let child = self
            .client
            .get_workflow_handle::<ForkWorkflow>(format!("{run_id}/fork-{fork}"));
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
