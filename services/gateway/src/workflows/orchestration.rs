//! `SandboxOrchestrationWorkflow`: one run. Its handlers are here, its state in
//! `run_state`, its run in `run_loop`.
//!
//! Opens the run's ledger account, then keeps at most `max_concurrent` forks in flight
//! until every fork has a result. Each fork is prepared here (budget reserved, sandbox
//! made and health-checked, as local activities: see `prepare`); then its steps (agent,
//! verify, patch, settle, destroy) run here too for a run of up to the gateway's
//! `--inline-fork-limit` forks (see `inline`), or in the fork's `ForkWorkflow` child for
//! a larger run (`RunSpec::inline_forks` false). A failed fork is a result, not a crash of
//! the run. Signals pause and resume it and cancel single forks; an update raises its
//! budget. When a fork's reservation is refused the run waits in AWAITING_BUDGET
//! (running forks go on; none starts) until the budget is raised.
//!
//! # Large fan-out
//!
//! A run of 1,000 forks must stay far from Temporal's history limits (warning at 10,240
//! events, 2,000 pending children or activities). So:
//! - a run of more than `--inline-fork-limit` forks (at most 1,300, default 1,000) gives each fork a child:
//!   per fork, the run's history holds its child's lifecycle (start initiated, started,
//!   completed) plus the workflow tasks that batch them; a wave's preparation (reserve,
//!   create, health check of all its forks) is one marker: about 4-5 events a fork
//!   (bench-fanout prints the length). A fork re-queued for budget is reserved again in a
//!   later wave;
//! - every later step of such a fork (agent, verify, patch, settle, destroy) lives in the
//!   child's own history, which stays a few dozen events;
//! - an inline fork (smaller runs) adds its agent's three events (six with verify) and a
//!   share of a finishing batch's; its patch is kept in the run's history only up to
//!   16 KiB (`history::PATCH_MAX_BYTES`), a larger one is handed to a child;
//! - forks in flight never exceed `max_concurrent` (capped at 500 by the gateway), so
//!   pending children or agent activities stay under 2,000 (local activities are not
//!   pending activities);
//! - the run keeps only a compact copy of each fork (no patch, no output tails) in its
//!   `progress` query and its result; `GetForkResult` reads a fork's full result from its
//!   child, or from the run's `fork_result` query for an inline fork;
//! - a child fork's progress (phase, agent heartbeats) is read from the child by the
//!   gateway, an inline fork's from the run's pending activities; never signalled into
//!   this history.
//!
//! The run's own per-fork events are the budget of its size: the gateway's
//! `--max-forks` (default 1,000) is capped at 1,300, which leaves room under the warning
//! for forks that wait for budget and start again, and for retried preparation rounds.

use super::{branching::BranchRequest, options, run_loop, run_state::SandboxOrchestrationWorkflow};
use forkyard_proto::{
    activities::Ledger,
    budget::v1::{Account, RaiseBudgetRequest},
    common::v1::ForkResult,
    gateway::v1::{Run, RunSpec},
};
use temporalio_macros::workflow_methods;
use temporalio_workflow::{
    SyncWorkflowContext, WorkflowContext, WorkflowContextView, WorkflowResult,
};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[workflow_methods]
impl SandboxOrchestrationWorkflow {
    #[init]
    pub fn new(_ctx: &WorkflowContextView, spec: RunSpec) -> Self {
        Self::starting(spec)
    }

    #[run(name = "SandboxOrchestrationWorkflow")]
    pub async fn run(ctx: &mut WorkflowContext<Self>) -> WorkflowResult<Run> {
        run_loop::run(ctx).await
    }

    /// The run with every fork's compact state.
    #[query]
    pub fn progress(&self, _ctx: &WorkflowContextView) -> Run {
        self.snapshot()
    }

    /// An inline fork's full result once it finished (`None`: not finished, or finished
    /// by a child workflow, whose result is the full one).
    #[query]
    pub fn fork_result(&self, _ctx: &WorkflowContextView, fork: u32) -> Option<ForkResult> {
        self.full.get(&fork).cloned()
    }

    #[signal]
    pub fn pause(&mut self, _ctx: &mut SyncWorkflowContext<Self>) {
        self.paused = true;
        self.generation += 1;
    }

    #[signal]
    pub fn resume(&mut self, _ctx: &mut SyncWorkflowContext<Self>) {
        self.paused = false;
        self.generation += 1;
    }

    /// A pending fork never starts; a running one is cancelled (its sandbox destroyed).
    #[signal]
    pub fn cancel_fork(&mut self, _ctx: &mut SyncWorkflowContext<Self>, fork: u32) {
        Self::cancel_fork_now(self, fork);
    }

    #[update_validator(branch_fork)]
    fn validate_branch_fork(
        &self,
        _ctx: &WorkflowContextView,
        req: &BranchRequest,
    ) -> Result<(), BoxError> {
        match self.refuse_branch(req) {
            Some(why) => Err(why.into()),
            None => Ok(()),
        }
    }

    /// Branch a finished fork (validated above): `count` new pending forks of this run,
    /// numbered after its forks, starting from the fork's end; their numbers.
    #[update]
    pub fn branch_fork(
        &mut self,
        _ctx: &mut SyncWorkflowContext<Self>,
        req: BranchRequest,
    ) -> Result<Vec<u32>, BoxError> {
        // Checked again: the state may have changed since the validator ran.
        if let Some(why) = self.refuse_branch(&req) {
            return Err(why.into());
        }
        Ok(self.add_branches(&req))
    }

    #[update_validator(raise_budget)]
    fn validate_raise_budget(
        &self,
        _ctx: &WorkflowContextView,
        amount_micros: &i64,
    ) -> Result<(), BoxError> {
        match self.refuse_raise(*amount_micros) {
            Some(why) => Err(why.into()),
            None => Ok(()),
        }
    }

    /// Raise the run's budget in the ledger; a run awaiting budget goes on.
    #[update]
    pub async fn raise_budget(
        ctx: &mut WorkflowContext<Self>,
        amount_micros: i64,
    ) -> Result<Account, BoxError> {
        let run_id = ctx.workflow_id().to_owned();
        // An account the first wave is still opening is raised once it is open (at
        // once in runs that opened it before any wave: the condition holds).
        let _ = ctx
            .wait_condition(|s| s.account.to_open.is_none() || s.account.error.is_some())
            .await;
        if let Some(e) = ctx.state(|s| s.account.error.clone()) {
            return Err(format!("raise budget: {e}").into());
        }
        let n = ctx.state_mut(|s| {
            s.raises += 1;
            s.raises
        });
        let req = RaiseBudgetRequest {
            account_id: run_id.clone(),
            amount_micros,
            idempotency_key: format!("{run_id}/raise-{n}"),
        };
        let account = ctx
            .execute_local_activity(Ledger::raise_budget, req, options::ledger_detached())
            .await
            .map_err(|e| -> BoxError { format!("raise budget: {e}").into() })?;
        ctx.state_mut(|s| {
            s.budget_micros = account.budget_micros;
            s.awaiting_budget = false;
            s.generation += 1;
        });
        Ok(account)
    }
}
