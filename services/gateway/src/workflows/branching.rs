//! Fork trees (#45): a finished fork of a run branched into new forks of the same run
//! (BranchFork, the run's `branch_fork` update), the branch window that keeps a run open
//! for them, and the removal of the run's snapshots when it closes.
//!
//! A run open for branches (`RunSpec::branch_window_secs` > 0, runs that take
//! [`Change::ForkTrees`]) snapshots each fork's workspace at its end, before its sandbox
//! goes (`lifecycle::finish`). A branch is a new fork numbered after the run's forks:
//! pending like any fork, prepared by the next wave from its parent's snapshot at the
//! replica holding it, run and finished as any fork, on the run's budget. Once no fork
//! is left, the run waits the window for more branches, then removes every snapshot
//! it took (also when cancelled) and closes.

use super::{
    input::BranchFrom, options, patches::Change, phase, run_state::SandboxOrchestrationWorkflow,
};
use crate::{activities::sandboxes::SandboxLocal, lifecycle::AtOwner};
use forkyard_proto::common::v1::{ForkResult, ForkStatus};
use serde::{Deserialize, Serialize};
use std::time::Duration;
use temporalio_workflow::{WorkflowCancellationToken, WorkflowContext};

type Ctx = WorkflowContext<SandboxOrchestrationWorkflow>;

/// The `branch_fork` update's input.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct BranchRequest {
    pub fork: u32,
    pub count: u32,
    pub prompt: String,
    /// The most forks the run may have with its branches (the gateway's limit).
    pub max_forks: u32,
    /// A running fork's branch point, captured by the gateway before the update (its
    /// runner held the fork's next model request while the workspace was snapshotted);
    /// none: the fork's end.
    pub point: Option<BranchPoint>,
}

/// A branch point taken of a running fork (`CaptureBranchPoint`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct BranchPoint {
    pub snapshot_id: String,
    /// The provisioner replica holding the snapshot.
    pub snapshot_endpoint: String,
    /// The agent's session at that point.
    pub session: String,
    /// The parent's model responses before it.
    pub turn: u32,
}

impl BranchRequest {
    /// The running fork's captured point, if the request carries one.
    fn running_point(&self) -> Option<&BranchPoint> {
        self.point.as_ref().filter(|p| !p.snapshot_id.is_empty())
    }
}

/// Whether a fork's status is an end a branch can start from.
pub fn is_finished(status: i32) -> bool {
    [
        ForkStatus::Succeeded,
        ForkStatus::Failed,
        ForkStatus::TimedOut,
        ForkStatus::BudgetExceeded,
    ]
    .iter()
    .any(|s| *s as i32 == status)
}

impl SandboxOrchestrationWorkflow {
    /// Why `req` cannot be branched now, if it cannot: the update's validator (the
    /// gateway checks the same first, to answer with the right status code).
    pub(super) fn refuse_branch(&self, req: &BranchRequest) -> Option<String> {
        let driver = self.spec.agent.as_ref().map_or("", |a| a.driver.as_str());
        let total = self.forks.len() as u64 + u64::from(req.count);
        let Some(parent) = req
            .fork
            .checked_sub(1)
            .and_then(|i| self.forks.get(i as usize))
        else {
            return Some(format!("fork: the run has no fork {}", req.fork));
        };
        let why = if !self.fork_trees || self.spec.branch_window_secs == 0 {
            "the run was launched without branch_window_secs: its forks cannot be branched".into()
        } else if self.branches_closed {
            "the run's branch window has closed".into()
        } else if req.count == 0 {
            "count: must be at least 1".into()
        } else if total > u64::from(req.max_forks) {
            format!(
                "count: the run would have {total} forks, more than its limit of {}",
                req.max_forks
            )
        } else if req.running_point().is_none() && !is_finished(parent.status) {
            format!(
                "fork {} has not finished: only a finished fork can be branched",
                req.fork
            )
        } else if req.running_point().is_none() && parent.snapshot_id.is_empty() {
            format!(
                "fork {} has no snapshot of its end to branch from",
                req.fork
            )
        } else if self.winner_found() {
            "the run stopped at its first verified fork".into()
        } else {
            return crate::validate::driver_refusal(driver);
        };
        Some(why)
    }

    /// Add `req.count` pending forks branched from `req.fork` (validated): from its end,
    /// or from the point captured while it ran. Their numbers.
    pub(super) fn add_branches(&mut self, req: &BranchRequest) -> Vec<u32> {
        let parent = self.forks[(req.fork - 1) as usize].clone();
        let owner = self.owners.get(&parent.fork).cloned().unwrap_or_default();
        let from = match req.running_point() {
            Some(p) => BranchFrom {
                parent_fork: parent.fork,
                depth: parent.depth + 1,
                snapshot_id: p.snapshot_id.clone(),
                // The sandbox's owner took the snapshot; the run knows it as the owner.
                snapshot_endpoint: if owner.is_empty() {
                    p.snapshot_endpoint.clone()
                } else {
                    owner
                },
                session: p.session.clone(),
                prompt: req.prompt.clone(),
                turn: p.turn,
            },
            None => BranchFrom {
                parent_fork: parent.fork,
                depth: parent.depth + 1,
                snapshot_id: parent.snapshot_id.clone(),
                snapshot_endpoint: owner,
                session: parent.agent_session.clone(),
                prompt: req.prompt.clone(),
                turn: 0,
            },
        };
        let mut added = Vec::new();
        for _ in 0..req.count {
            let fork = self.forks.len() as u32 + 1;
            self.forks.push(ForkResult {
                fork,
                status: ForkStatus::Pending as i32,
                branch: forkyard_proto::ids::fork_branch(&self.spec.branch, fork),
                phase: phase::PENDING.into(),
                parent_fork: from.parent_fork,
                depth: from.depth,
                branch_turn: from.turn,
                ..Default::default()
            });
            self.attempts.push(0);
            self.lost.push(0);
            self.branches.insert(fork, from.clone());
            added.push(fork);
        }
        self.generation += 1;
        added
    }
}

/// The run is out of forks: wait its branch window for a branch (`true`: one came, fly
/// again), or close it to branches (`false`). Runs without a window close at once.
pub(super) async fn wait_for_branches(ctx: &Ctx, cancel: &WorkflowCancellationToken) -> bool {
    let (window, fork_trees) = ctx.state(|s| (s.spec.branch_window_secs, s.fork_trees));
    if !fork_trees || window == 0 || cancel.is_cancelled() {
        ctx.state_mut(|s| s.branches_closed = true);
        return false;
    }
    let until = forkyard_common::clock::unix_ms(ctx.workflow_time()) + i64::from(window) * 1000;
    ctx.state_mut(|s| s.branchable_until_unix_ms = until);
    let timer = ctx.timer(Duration::from_secs(u64::from(window)));
    let branched = ctx.wait_condition(|s| s.has_pending());
    futures::pin_mut!(timer, branched);
    let came = match futures::future::select(timer, branched).await {
        futures::future::Either::Left(_) => false,
        futures::future::Either::Right(_) => !cancel.is_cancelled(),
    };
    ctx.state_mut(|s| {
        s.branchable_until_unix_ms = 0;
        s.branches_closed = !came;
    });
    came
}

/// Remove every snapshot the run's forks left (their branch points: their ends, and
/// the points captured while they ran), whatever the run's cancellation; one that
/// cannot be removed is left to the janitor's sweep.
pub(super) async fn remove_snapshots(ctx: &Ctx) {
    if !ctx.state(|s| s.fork_trees) {
        return;
    }
    let snapshots: Vec<AtOwner> = ctx.state(SandboxOrchestrationWorkflow::snapshots);
    let removals = snapshots.into_iter().map(|at| {
        ctx.execute_local_activity(
            SandboxLocal::delete_snapshot,
            at,
            options::destroy_local(false),
        )
    });
    let _ = super::join::join_all(removals).await;
}

impl SandboxOrchestrationWorkflow {
    /// The run's snapshots, each once: its forks' ends, then the running forks' points
    /// its branches started from (only runs that branched a running fork have those, so
    /// earlier histories replay the same removals).
    fn snapshots(&self) -> Vec<AtOwner> {
        let at = |endpoint: &str, id: &str| AtOwner {
            endpoint: endpoint.to_owned(),
            sandbox_id: id.to_owned(),
            reason: "run closed".into(),
        };
        let mut out: Vec<AtOwner> = self
            .forks
            .iter()
            .filter(|f| !f.snapshot_id.is_empty())
            .map(|f| {
                at(
                    self.owners.get(&f.fork).map_or("", String::as_str),
                    &f.snapshot_id,
                )
            })
            .collect();
        for b in self.branches.values().filter(|b| b.turn > 0) {
            if !out.iter().any(|a| a.sandbox_id == b.snapshot_id) {
                out.push(at(&b.snapshot_endpoint, &b.snapshot_id));
            }
        }
        out
    }
}

/// Whether the run takes fork trees (decided at its start).
pub(super) fn takes_fork_trees(ctx: &Ctx) -> bool {
    ctx.state(|s| s.patches).takes(ctx, Change::ForkTrees)
}

#[cfg(test)]
mod tests {
    use super::*;
    use forkyard_proto::{common::v1::AgentSpec, gateway::v1::RunSpec};

    fn run(driver: &str, window: u32) -> SandboxOrchestrationWorkflow {
        let mut w = SandboxOrchestrationWorkflow::starting(RunSpec {
            forks: 2,
            branch: "fy".into(),
            branch_window_secs: window,
            agent: Some(AgentSpec {
                driver: driver.into(),
                ..Default::default()
            }),
            ..Default::default()
        });
        w.fork_trees = true;
        w.forks[0].status = ForkStatus::Failed as i32;
        w.forks[0].snapshot_id = "snap-1".into();
        w.forks[0].agent_session = "5e0c2a9e-1111".into();
        w.owners.insert(1, "http://prov-b:50052".into());
        w.forks[1].status = ForkStatus::Running as i32;
        w
    }

    fn req(fork: u32, count: u32) -> BranchRequest {
        BranchRequest {
            fork,
            count,
            prompt: "again".into(),
            max_forks: 5,
            point: None,
        }
    }

    #[test]
    fn branches_of_a_finished_fork_are_numbered_after_the_runs_forks_with_its_end() {
        for driver in ["codex", "anthropic", "openai", "command"] {
            assert_eq!(run(driver, 60).refuse_branch(&req(1, 3)), None, "{driver}");
        }
        let mut w = run("claude-code", 60);
        assert_eq!(w.refuse_branch(&req(1, 3)), None);
        assert_eq!(w.add_branches(&req(1, 3)), vec![3, 4, 5]);
        assert!(w.has_pending());
        let b = &w.branches[&4];
        assert_eq!(
            (
                b.parent_fork,
                b.depth,
                b.snapshot_id.as_str(),
                b.session.as_str()
            ),
            (1, 1, "snap-1", "5e0c2a9e-1111")
        );
        assert_eq!(b.snapshot_endpoint, "http://prov-b:50052");
        assert_eq!(w.forks[4].branch, "fy-fork-5");
        assert_eq!((w.forks[4].parent_fork, w.forks[4].depth), (1, 1));
        assert_eq!((w.attempts.len(), w.lost.len()), (5, 5));
    }

    #[test]
    fn a_running_forks_captured_point_is_where_its_branches_start_and_goes_with_the_run() {
        let mut w = run("claude-code", 60);
        let point = BranchPoint {
            snapshot_id: "snap-mid".into(),
            snapshot_endpoint: "http://prov-c:50052".into(),
            session: "7d1c0a9e-2222".into(),
            turn: 3,
        };
        // Fork 2 runs: without a point it is refused, with one it branches.
        assert!(w.refuse_branch(&req(2, 1)).is_some());
        let with_point = BranchRequest {
            point: Some(point.clone()),
            ..req(2, 2)
        };
        assert_eq!(w.refuse_branch(&with_point), None);
        assert_eq!(w.add_branches(&with_point), vec![3, 4]);
        let b = &w.branches[&3];
        assert_eq!(
            (
                b.parent_fork,
                b.snapshot_id.as_str(),
                b.session.as_str(),
                b.turn
            ),
            (2, "snap-mid", "7d1c0a9e-2222", 3)
        );
        // No owner known for fork 2 here: the capture's provisioner.
        assert_eq!(b.snapshot_endpoint, "http://prov-c:50052");
        assert_eq!((w.forks[3].parent_fork, w.forks[3].branch_turn), (2, 3));
        // Removed when the run closes, once for both branches, with fork 1's end.
        let snaps: Vec<_> = w.snapshots().into_iter().map(|a| a.sandbox_id).collect();
        assert_eq!(snaps, vec!["snap-1", "snap-mid"]);
    }

    #[test]
    fn each_refusal_names_its_reason() {
        let cases = [
            (run("command", 60), req(3, 1), "fork: the run has no fork 3"),
            (run("command", 60), req(1, 0), "count: must be at least 1"),
            (
                run("command", 60),
                req(1, 4),
                "count: the run would have 6 forks",
            ),
            (run("command", 60), req(2, 1), "fork 2 has not finished"),
            (run("command", 0), req(1, 1), "without branch_window_secs"),
            (
                run("gpt-pilot", 60),
                req(1, 1),
                "\"gpt-pilot\" is no driver",
            ),
        ];
        for (w, r, says) in cases {
            let why = w.refuse_branch(&r).unwrap_or_default();
            assert!(why.contains(says), "{r:?}: {why:?}");
        }
        let mut closed = run("command", 60);
        closed.branches_closed = true;
        assert!(
            closed
                .refuse_branch(&req(1, 1))
                .unwrap()
                .contains("window has closed")
        );
        let mut no_snapshot = run("command", 60);
        no_snapshot.forks[0].snapshot_id.clear();
        assert!(
            no_snapshot
                .refuse_branch(&req(1, 1))
                .unwrap()
                .contains("no snapshot")
        );
    }
}
