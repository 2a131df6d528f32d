//! The run workflow's state: its forks and what it keeps to decide what starts next,
//! changed only through these methods, which are functions of what happened (a fork
//! finished, a signal came) and never run an activity. The workflow's code is in
//! `orchestration` (its handlers) and `run_loop` (its run).

use super::{
    patches::Patches,
    phase,
    prepare::{AccountOpening, OpensAccount},
};
use crate::lifecycle::SANDBOX_LOST;
use forkyard_proto::{
    common::v1::{Delivered, ForkResult, ForkStatus, VerifyStatus},
    gateway::v1::RunSpec,
};
use std::collections::{BTreeMap, BTreeSet};

mod view;

use temporalio_macros::workflow;
pub use view::outcome;

#[workflow]
pub struct SandboxOrchestrationWorkflow {
    pub(super) spec: RunSpec,
    pub(super) forks: Vec<ForkResult>,
    pub(super) started_unix_ms: i64,
    pub(super) finished_unix_ms: i64,
    pub(super) error: String,
    pub(super) budget_micros: i64,
    pub(super) paused: bool,
    pub(super) awaiting_budget: bool,
    /// Running forks whose cancellation was asked for and not yet passed on to their
    /// cancellation tokens (kept by the run loop: the state must be `Send`).
    pub(super) cancel_requests: BTreeSet<u32>,
    /// Starts of each fork, for the idempotency keys of a re-queued fork.
    pub(super) attempts: Vec<u32>,
    /// Which workflow changes this run takes ([`patches`](super::patches)).
    pub(super) patches: Patches,
    /// Forks whose sandbox was lost start again on a new one, at most
    /// [`MAX_LOST_SANDBOX_STARTS`] times each.
    pub(super) requeue_lost: bool,
    pub(super) lost: Vec<u32>,
    /// A re-started fork reserves what its fork budget has left after its earlier
    /// starts, and a refused reservation is tried again once another fork settled (and
    /// gave back what it did not spend): without it a re-started fork asked for its
    /// whole budget again, was refused by the few micros its first start spent, and the
    /// run waited for a raise nobody had to make.
    pub(super) within_budget: bool,
    /// What the earlier starts of a re-started fork spent (total, model, sandbox), added
    /// to its result so the run's cost stays what the ledger holds.
    pub(super) earlier_cost: BTreeMap<u32, (i64, i64, i64)>,
    /// Inline forks' full results (patch and output tails), for `fork_result`.
    pub(super) full: BTreeMap<u32, ForkResult>,
    pub(super) raises: u32,
    /// Bumped by every signal and update, so the main loop re-evaluates.
    pub(super) generation: u64,
    /// The run's ledger account while its first wave is to open it, or why it could not.
    pub(super) account: AccountOpening,
    /// A wave was prepared: later ones are regular activities (runs that take
    /// [`Change::LaterWavesAreActivities`]).
    pub(super) first_wave_prepared: bool,
    /// The run takes fork trees ([`Change::ForkTrees`](super::patches::Change)).
    pub(super) fork_trees: bool,
    /// Branched forks' branch points, by fork (see `branching`).
    pub(super) branches: BTreeMap<u32, super::input::BranchFrom>,
    /// The provisioner replica that held each started fork's sandbox (and so holds its
    /// snapshot); recorded for runs open for branches.
    pub(super) owners: BTreeMap<u32, String>,
    /// The branch window is over: no branch is taken any more.
    pub(super) branches_closed: bool,
    /// While the run waits for branches: when it stops waiting.
    pub(super) branchable_until_unix_ms: i64,
    /// Where the run's search is (`rounds`).
    pub(super) search: super::search_state::SearchState,
    /// A fork that waits for room after its backend refused it: the first of the run's
    /// backends it may go to (`placement`).
    pub(super) floors: BTreeMap<u32, usize>,
}

/// Times a fork whose sandbox was lost is started again (beyond its first start).
const MAX_LOST_SANDBOX_STARTS: u32 = 2;

/// The run's copy of a fork: the large fields stay in the child's result.
fn compact(mut f: ForkResult) -> ForkResult {
    f.patch.clear();
    f.agent_output_tail.clear();
    f.verify_output_tail.clear();
    f.error.truncate(512);
    f
}

fn is_running(f: &ForkResult) -> bool {
    f.status == ForkStatus::Running as i32
}

impl SandboxOrchestrationWorkflow {
    /// A run of `spec`, before anything started.
    pub(super) fn starting(spec: RunSpec) -> Self {
        let search = super::search_state::SearchState::starting(&spec);
        let forks = (1..=spec.forks)
            .map(|fork| ForkResult {
                fork,
                status: ForkStatus::Pending as i32,
                branch: forkyard_proto::ids::fork_branch(&spec.branch, fork),
                phase: phase::PENDING.into(),
                ..Default::default()
            })
            .collect();
        Self {
            budget_micros: spec.budget_micros,
            attempts: vec![0; spec.forks as usize],
            patches: Patches::default(),
            requeue_lost: false,
            within_budget: false,
            lost: vec![0; spec.forks as usize],
            earlier_cost: BTreeMap::new(),
            full: BTreeMap::new(),
            spec,
            forks,
            started_unix_ms: 0,
            finished_unix_ms: 0,
            error: String::new(),
            paused: false,
            awaiting_budget: false,
            cancel_requests: BTreeSet::new(),
            raises: 0,
            generation: 0,
            account: AccountOpening::default(),
            first_wave_prepared: false,
            fork_trees: false,
            branches: BTreeMap::new(),
            owners: BTreeMap::new(),
            branches_closed: false,
            branchable_until_unix_ms: 0,
            search,
            floors: BTreeMap::new(),
        }
    }

    pub(super) fn has_pending(&self) -> bool {
        self.forks
            .iter()
            .any(|f| f.status == ForkStatus::Pending as i32)
    }

    pub(super) fn winner_found(&self) -> bool {
        self.spec.stop_on_first_verified
            && self
                .forks
                .iter()
                .any(|f| f.verify == VerifyStatus::Passed as i32)
    }

    /// What a fork's start reserves: its budget, less what its earlier starts spent.
    pub(super) fn reservation_for(&self, fork: u32) -> i64 {
        let spent = if self.within_budget {
            self.earlier_cost.get(&fork).map_or(0, |c| c.0)
        } else {
            0
        };
        self.spec.fork_budget_micros - spent
    }

    /// The next pending fork, marked running, with its attempt number.
    pub(super) fn next_startable(&mut self) -> Option<(u32, u32)> {
        if !self.may_start() {
            return None;
        }
        let fork = self
            .forks
            .iter()
            .find(|f| f.status == ForkStatus::Pending as i32)?
            .fork;
        Some((fork, self.begin(fork)))
    }

    /// Whether any fork may start now (not paused, not waiting for budget, no winner).
    pub(super) fn may_start(&self) -> bool {
        !(self.paused || self.awaiting_budget || self.winner_found())
    }

    /// Pending `fork` starts: marked running; its attempt number.
    pub(super) fn begin(&mut self, fork: u32) -> u32 {
        let i = (fork - 1) as usize;
        let f = &mut self.forks[i];
        f.status = ForkStatus::Running as i32;
        f.phase = phase::RESERVING.into();
        f.error.clear();
        self.attempts[i] += 1;
        self.attempts[i]
    }

    /// A running inline fork's progress as the run shows it (compact).
    pub(super) fn show(&mut self, fork: u32, r: &ForkResult) {
        if let Some(slot) = fork
            .checked_sub(1)
            .and_then(|i| self.forks.get_mut(i as usize))
        {
            let branch = std::mem::take(&mut slot.branch);
            *slot = compact(r.clone());
            if slot.branch.is_empty() {
                slot.branch = branch;
            }
        }
    }

    pub(super) fn set_fork_phase(&mut self, fork: u32, p: &str) {
        if let Some(f) = fork
            .checked_sub(1)
            .and_then(|i| self.forks.get_mut(i as usize))
        {
            p.clone_into(&mut f.phase);
        }
    }

    pub(super) fn record(&mut self, fork: u32, result: ForkResult) {
        let i = (fork - 1) as usize;
        let branch = std::mem::take(&mut self.forks[i].branch);
        let placed = std::mem::take(&mut self.forks[i].backend);
        let requeue = result.phase == phase::AWAITING_BUDGET
            && result.status == ForkStatus::BudgetExceeded as i32;
        let lost = self.requeue_lost
            && result.status == ForkStatus::Failed as i32
            && result.error.contains(SANDBOX_LOST)
            && self.lost[i] < MAX_LOST_SANDBOX_STARTS;
        self.search.note(fork, &result);
        let mut slot = compact(result);
        slot.fork = fork;
        self.add_earlier_cost(&mut slot);
        if slot.branch.is_empty() {
            slot.branch = branch;
        }
        // A fork that ended without a sandbox still says where it was placed (a run
        // over several backends).
        if slot.backend.is_empty() {
            slot.backend = placed;
        }
        // A fork whose earlier starts spent its whole budget does not start again.
        let lost =
            lost && !(self.within_budget && slot.cost_micros >= self.spec.fork_budget_micros);
        if self.within_budget && !requeue && self.awaiting_budget {
            // This fork settled: what it held is back, so a refused fork may fit now.
            self.awaiting_budget = false;
        }
        if requeue {
            // Its reservation was refused: it starts again once the budget is raised.
            slot.status = ForkStatus::Pending as i32;
            self.awaiting_budget = true;
        } else if lost {
            // What its agent spent is committed; it starts again, on a new sandbox.
            self.lost[i] += 1;
            self.earlier_cost.insert(
                fork,
                (
                    slot.cost_micros,
                    slot.model_cost_micros,
                    slot.sandbox_cost_micros,
                ),
            );
            slot.status = ForkStatus::Pending as i32;
            slot.phase = phase::PENDING.into();
            slot.error = format!("{}; starting again on a new sandbox", slot.error);
        }
        let verified = slot.verify == VerifyStatus::Passed as i32;
        self.forks[i] = slot;
        if verified && self.spec.stop_on_first_verified {
            self.stop_others(fork);
        }
    }

    /// What the fork's earlier starts (each on a sandbox since lost) spent, added to what
    /// this one did (and to its full result).
    fn add_earlier_cost(&mut self, slot: &mut ForkResult) {
        let fork = slot.fork;
        if let Some((total, model, sandbox)) = self.earlier_cost.remove(&fork) {
            slot.cost_micros += total;
            slot.model_cost_micros += model;
            slot.sandbox_cost_micros += sandbox;
            if let Some(full) = self.full.get_mut(&fork) {
                full.cost_micros += total;
                full.model_cost_micros += model;
                full.sandbox_cost_micros += sandbox;
            }
        }
    }

    /// Best-of-N early stop, `fork` verified first: the others are not needed any more.
    fn stop_others(&mut self, fork: u32) {
        for f in &mut self.forks {
            if f.status == ForkStatus::Pending as i32 {
                f.status = ForkStatus::Cancelled as i32;
                f.phase = phase::DONE.into();
                f.error = format!("fork {fork} verified first");
            } else if is_running(f) {
                self.cancel_requests.insert(f.fork);
            }
        }
    }

    /// Where the run's delivery put `fork` (`workflows::deliver`): on the run's copy,
    /// and on the full result it keeps of an inline fork.
    pub(super) fn record_delivered(&mut self, fork: u32, d: Delivered) {
        if let Some(full) = self.full.get_mut(&fork) {
            full.delivered = Some(d.clone());
        }
        if let Some(f) = self.forks.get_mut((fork as usize).wrapping_sub(1)) {
            f.delivered = Some(d);
        }
    }

    /// CancelFork: a pending fork never starts; a running one is cancelled (its sandbox
    /// destroyed).
    pub(super) fn cancel_fork_now(&mut self, fork: u32) {
        let Some(f) = fork
            .checked_sub(1)
            .and_then(|i| self.forks.get_mut(i as usize))
        else {
            return;
        };
        if f.status == ForkStatus::Pending as i32 {
            f.status = ForkStatus::Cancelled as i32;
            f.phase = phase::DONE.into();
            f.error = "fork cancelled before it started".into();
        } else if is_running(f) {
            self.cancel_requests.insert(fork);
        }
        self.generation += 1;
    }

    /// Why RaiseBudget cannot take `amount_micros`, if it cannot.
    pub(super) fn refuse_raise(&self, amount_micros: i64) -> Option<&'static str> {
        if amount_micros <= 0 {
            Some("amount must be more than 0")
        } else if self.finished_unix_ms != 0 {
            Some("the run has finished")
        } else if self.budget_micros.checked_add(amount_micros).is_none() {
            Some("the budget would overflow")
        } else {
            None
        }
    }

    /// The run was cancelled: forks that never started end cancelled.
    pub(super) fn cancel_pending(&mut self, now: i64) {
        for f in self
            .forks
            .iter_mut()
            .filter(|f| f.status == ForkStatus::Pending as i32)
        {
            f.status = ForkStatus::Cancelled as i32;
            f.phase = phase::DONE.into();
            f.error = "run cancelled before the fork started".into();
        }
        self.finished_unix_ms = now;
    }

    /// The run ends before any fork ran (its account could not be opened, or it was
    /// cancelled meanwhile): every fork ends with the reason.
    pub(super) fn end_every_fork(&mut self, msg: &str, cancelled: bool, now: i64) {
        self.error = msg.to_owned();
        self.finished_unix_ms = now;
        let status = if cancelled {
            ForkStatus::Cancelled
        } else {
            ForkStatus::Failed
        };
        for f in &mut self.forks {
            f.status = status as i32;
            f.phase = phase::DONE.into();
            msg.clone_into(&mut f.error);
        }
    }
}

impl OpensAccount for SandboxOrchestrationWorkflow {
    fn account(&mut self) -> &mut AccountOpening {
        &mut self.account
    }

    fn move_fork(&mut self, fork: u32, from: &str) -> Option<String> {
        self.move_on(fork, from)
    }

    fn wait_for_room(&mut self, fork: u32, from: &str) -> Option<String> {
        SandboxOrchestrationWorkflow::wait_for_room(self, fork, from)
    }
}
