//! `SandboxOrchestrationWorkflow`: one run.
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

use super::{
    LABELS_ATTR, RUN_STATE_ATTR,
    failure::{SANDBOX_LOST, StepFailure},
    fork::{ForkInput, ForkWorkflow, apply_failure},
    inline::{self, AgentDone},
    options,
    patches::{Change, Patches},
    phase,
    prepare::{self, Prepared, WaveFork, prepare_wave},
    unix_ms,
};
use crate::wave::AccountOpen;
use forkyard_proto::{
    activities::Ledger,
    budget::v1::{
        Account, AccountKind, CreateAccountRequest, OpenAccountRequest, RaiseBudgetRequest,
    },
    common::v1::{ForkResult, ForkStatus, VerifyStatus},
    gateway::v1::{Run, RunSpec, RunState},
};
use futures::{
    FutureExt,
    future::{LocalBoxFuture, select_all},
};
use std::collections::{BTreeMap, BTreeSet};
use temporalio_common::error::ApplicationFailure;
use temporalio_macros::{workflow, workflow_methods};
use temporalio_workflow::{
    ChildWorkflowCancellationType, ChildWorkflowOptions, ParentClosePolicy, SyncWorkflowContext,
    WaitConditionOptions, WorkflowCancellationToken, WorkflowContext, WorkflowContextView,
    WorkflowResult, WorkflowTermination,
};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[workflow]
pub struct SandboxOrchestrationWorkflow {
    spec: RunSpec,
    forks: Vec<ForkResult>,
    started_unix_ms: i64,
    finished_unix_ms: i64,
    error: String,
    budget_micros: i64,
    paused: bool,
    awaiting_budget: bool,
    /// Running forks whose cancellation was asked for and not yet passed on to their
    /// cancellation tokens (kept by the run loop: the state must be `Send`).
    cancel_requests: BTreeSet<u32>,
    /// Starts of each fork, for the idempotency keys of a re-queued fork.
    attempts: Vec<u32>,
    /// Which workflow changes this run takes ([`patches`](super::patches)).
    pub(super) patches: Patches,
    /// Forks whose sandbox was lost start again on a new one, at most
    /// [`MAX_LOST_SANDBOX_STARTS`] times each.
    requeue_lost: bool,
    lost: Vec<u32>,
    /// A re-started fork reserves what its fork budget has left after its earlier
    /// starts, and a refused reservation is tried again once another fork settled (and
    /// gave back what it did not spend): without it a re-started fork asked for its
    /// whole budget again, was refused by the few micros its first start spent, and the
    /// run waited for a raise nobody had to make.
    within_budget: bool,
    /// What the earlier starts of a re-started fork spent (total, model, sandbox), added
    /// to its result so the run's cost stays what the ledger holds.
    earlier_cost: BTreeMap<u32, (i64, i64, i64)>,
    /// Inline forks' full results (patch and output tails), for `fork_result`.
    full: BTreeMap<u32, ForkResult>,
    raises: u32,
    /// Bumped by every signal and update, so the main loop re-evaluates.
    generation: u64,
    /// The run's ledger account, while the next wave is to open it (runs that take
    /// [`Change::AccountOpenedWithFirstWave`]).
    pub(super) account_to_open: Option<AccountOpen>,
    /// Why a wave could not open it: the run fails.
    pub(super) open_error: Option<String>,
    /// A wave was prepared: later ones are regular activities (runs that take
    /// [`Change::LaterWavesAreActivities`]).
    pub(super) first_wave_prepared: bool,
}

/// Times a fork whose sandbox was lost is started again (beyond its first start).
const MAX_LOST_SANDBOX_STARTS: u32 = 2;

fn child_id(run_id: &str, fork: u32) -> String {
    format!("{run_id}/fork-{fork}")
}

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

#[workflow_methods]
impl SandboxOrchestrationWorkflow {
    #[init]
    pub fn new(_ctx: &WorkflowContextView, spec: RunSpec) -> Self {
        let forks = (1..=spec.forks)
            .map(|fork| ForkResult {
                fork,
                status: ForkStatus::Pending as i32,
                branch: format!("{}-fork-{fork}", spec.branch),
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
            account_to_open: None,
            open_error: None,
            first_wave_prepared: false,
        }
    }

    #[run(name = "SandboxOrchestrationWorkflow")]
    pub async fn run(ctx: &mut WorkflowContext<Self>) -> WorkflowResult<Run> {
        // First, before any await (see `patches`).
        let patches = Patches::decide(ctx);
        let run_id = ctx.workflow_id().to_owned();
        let spec = ctx.state(|s| s.spec.clone());
        let started = unix_ms(ctx.workflow_time());
        ctx.state_mut(|s| {
            s.started_unix_ms = started;
            s.patches = patches;
        });

        let open = if spec.tenant_account_id.is_empty() {
            AccountOpen::Open(OpenAccountRequest {
                account_id: run_id.clone(),
                budget_micros: spec.budget_micros,
                idempotency_key: format!("{run_id}/open-account"),
            })
        } else {
            // A tenant's run draws on the tenant's account too (its spending limit).
            AccountOpen::Create(CreateAccountRequest {
                account_id: run_id.clone(),
                kind: AccountKind::Run as i32,
                parent_account_id: spec.tenant_account_id.clone(),
                budget_micros: spec.budget_micros,
                idempotency_key: format!("{run_id}/open-account"),
                ..Default::default()
            })
        };
        if patches.takes(ctx, Change::AccountOpenedWithFirstWave) {
            // Opened by the first wave's activity, beside its sandboxes' creates.
            ctx.state_mut(|s| s.account_to_open = Some(open));
        } else if let Err(e) = prepare::open_account(ctx, open).await {
            return Err(fail_unopened(ctx, e));
        }

        // Where runs of earlier builds asked for these (after opening the account).
        let requeue_lost = patches.takes(ctx, Change::RequeueLostSandbox);
        let within_budget = patches.takes(ctx, Change::LostForkWithinBudget);
        ctx.state_mut(|s| {
            s.requeue_lost = requeue_lost;
            s.within_budget = within_budget;
        });
        let max_concurrent = spec.max_concurrent.clamp(1, spec.forks.max(1)) as usize;
        let cancel = ctx.cancellation_token();
        let mut published = String::new();
        let mut in_flight: Vec<LocalBoxFuture<'_, (u32, ChildOutcome)>> = Vec::new();
        let mut tokens: BTreeMap<u32, WorkflowCancellationToken> = BTreeMap::new();
        loop {
            publish_state(ctx, &mut published);
            let ctx_ref = &*ctx;
            // Start what may start: prepare them as one wave, then start their children.
            let mut wave = Vec::new();
            while in_flight.len() + wave.len() < max_concurrent && !cancel.is_cancelled() {
                let Some((fork, attempt)) = ctx_ref.state_mut(|s| s.next_startable()) else {
                    break;
                };
                let input = ForkInput {
                    run_id: run_id.clone(),
                    fork,
                    attempt,
                    spec: spec.clone(),
                    reservation_micros: ctx_ref.state(|s| s.reservation_for(fork)),
                    started_unix_ms: unix_ms(ctx_ref.workflow_time()),
                    ..ForkInput::default()
                };
                // The fork's own token: its preparation and its child stop on it.
                let token = ctx_ref.cancellation_token().child_token();
                tokens.insert(fork, token.clone());
                wave.push(WaveFork {
                    child_id: child_id(&run_id, fork),
                    input,
                    cancel: token,
                });
            }
            if !wave.is_empty() {
                let outcomes = prepare_wave(ctx_ref, &wave).await;
                if let Some(e) = ctx_ref.state(|s| s.open_error.clone()) {
                    // Its forks' sandboxes are destroyed; nothing was reserved.
                    return Err(fail_unopened(ctx_ref, e));
                }
                for (f, outcome) in wave.into_iter().zip(outcomes) {
                    let fork = f.input.fork;
                    match outcome {
                        Ok(prepared) => in_flight.push(start_fork(ctx_ref, f, prepared)),
                        Err(why) => {
                            tokens.remove(&fork);
                            let result = not_started(ctx_ref, &f.input, why);
                            ctx_ref.state_mut(|s| s.record(fork, result));
                        }
                    }
                }
                continue;
            }
            for fork in ctx_ref.state_mut(|s| std::mem::take(&mut s.cancel_requests)) {
                if let Some(t) = tokens.get(&fork) {
                    t.cancel_with_reason("fork cancelled");
                }
            }
            if in_flight.is_empty() {
                let waiting = ctx_ref.state(|s| s.has_pending() && (s.paused || s.awaiting_budget));
                if !waiting || cancel.is_cancelled() {
                    break;
                }
                // Paused or out of budget with nothing running: wait for resume, a
                // raise, a cancel.
                let seen = ctx_ref.state(|s| s.generation);
                let _ = ctx_ref.wait_condition(|s| s.generation != seen).await;
                continue;
            }
            let seen = ctx_ref.state(|s| s.generation);
            // Not tied to the run's cancellation: once cancelled, the children (which
            // inherit it) finish their cleanup and complete, and that is what to wait for.
            let detached = WaitConditionOptions::builder()
                .cancellation_token(WorkflowCancellationToken::new())
                .build();
            let changed = ctx_ref
                .wait_condition_with_options(move |s| s.generation != seen, detached)
                .fuse();
            let next = select_all(in_flight.iter_mut()).fuse();
            futures::pin_mut!(changed, next);
            // Completions first, so a replay sees the same order.
            let done = futures::select_biased! {
                (out, index, _) = next => Some((out, index)),
                _ = changed => None,
            };
            let Some(((fork, outcome), index)) = done else {
                continue;
            };
            drop(in_flight.remove(index));
            // Every other child already done too (in vector order), so the next wave
            // prepares their successors together.
            // Polled with this task's own waker: the SDK refuses foreign wakers.
            let mut finished = vec![(fork, outcome)];
            let ready = std::future::poll_fn(|cx| {
                let mut ready = Vec::new();
                let mut i = 0;
                while i < in_flight.len() {
                    if let std::task::Poll::Ready(out) = in_flight[i].as_mut().poll(cx) {
                        drop(in_flight.remove(i));
                        ready.push(out);
                    } else {
                        i += 1;
                    }
                }
                std::task::Poll::Ready(ready)
            })
            .await;
            finished.extend(ready);
            // Inline forks whose agent ended in this activation finish together, in the
            // order their completions came (see `inline`).
            let mut batch = Vec::new();
            for (fork, outcome) in finished {
                let result = match outcome {
                    ChildOutcome::Finished(result) => *result,
                    ChildOutcome::AgentDone(done) => {
                        batch.push(*done);
                        continue;
                    }
                    ChildOutcome::NotStarted(not) => {
                        let (f, prepared, why) = *not;
                        // Nobody else owns the sandbox and the reservation yet. Given back
                        // here, one fork at a time (see `prepare_wave` on why not
                        // concurrently).
                        let _ = prepare::destroy(
                            ctx_ref,
                            &prepared.sandbox,
                            "fork child did not start",
                        )
                        .await;
                        let key = prepare::step_key(&f.child_id, f.input.attempt, "release");
                        prepare::release(ctx_ref, &key, &prepared.reservation_id).await;
                        not_started(ctx_ref, &f.input, why)
                    }
                };
                tokens.remove(&fork);
                ctx_ref.state_mut(|s| s.record(fork, result));
            }
            if !batch.is_empty() {
                for outcome in inline::finish(ctx_ref, batch).await {
                    match outcome {
                        inline::Outcome::Done(fork, result) => {
                            tokens.remove(&fork);
                            // As the fork workflows' interceptor does for theirs.
                            if !ctx_ref.is_replaying() {
                                let model = spec.agent.as_ref().map_or("", |a| a.model.as_str());
                                crate::fork_telemetry::record(&result, model);
                            }
                            ctx_ref.state_mut(|s| {
                                s.full.insert(fork, (*result).clone());
                                s.record(fork, *result);
                            });
                        }
                        inline::Outcome::HandOff(h) => {
                            let (f, prepared, input) = *h;
                            in_flight.push(run_child(ctx_ref, f, prepared, input));
                        }
                    }
                }
            }
        }
        drop(in_flight);

        let now = unix_ms(ctx.workflow_time());
        if cancel.is_cancelled() {
            ctx.state_mut(|s| {
                for f in s
                    .forks
                    .iter_mut()
                    .filter(|f| f.status == ForkStatus::Pending as i32)
                {
                    f.status = ForkStatus::Cancelled as i32;
                    f.phase = phase::DONE.into();
                    f.error = "run cancelled before the fork started".into();
                }
                s.finished_unix_ms = now;
            });
            return Err(WorkflowTermination::cancelled());
        }
        let run = ctx.state_mut(|s| {
            s.finished_unix_ms = now;
            s.snapshot()
        });
        // Runs from this build on publish how they ended, so ListRuns can tell a run in
        // which no fork succeeded (FAILED) from one that completed. A patch: the upsert
        // is a new command that histories of earlier builds do not hold.
        if patches.takes(ctx, Change::RunOutcomeAttribute) {
            let (state, _) = outcome(&run);
            ctx.upsert_search_attributes(vec![
                RUN_STATE_ATTR.value_set(state.as_str_name().to_owned()),
            ]);
        }
        Ok(run)
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

    #[update_validator(raise_budget)]
    fn validate_raise_budget(
        &self,
        _ctx: &WorkflowContextView,
        amount_micros: &i64,
    ) -> Result<(), BoxError> {
        if *amount_micros <= 0 {
            return Err("amount must be more than 0".into());
        }
        if self.finished_unix_ms != 0 {
            return Err("the run has finished".into());
        }
        if self.budget_micros.checked_add(*amount_micros).is_none() {
            return Err("the budget would overflow".into());
        }
        Ok(())
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
            .wait_condition(|s| s.account_to_open.is_none() || s.open_error.is_some())
            .await;
        if let Some(e) = ctx.state(|s| s.open_error.clone()) {
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

/// A run whose account could not be opened: every fork ends with the reason (cancelled,
/// when the run was cancelled meanwhile), and so does the run.
fn fail_unopened(
    ctx: &WorkflowContext<SandboxOrchestrationWorkflow>,
    e: String,
) -> WorkflowTermination {
    let cancelled = ctx.cancellation_token().is_cancelled();
    let msg = if cancelled {
        "run cancelled".to_owned()
    } else {
        e
    };
    let now = unix_ms(ctx.workflow_time());
    ctx.state_mut(|s| {
        s.error.clone_from(&msg);
        s.finished_unix_ms = now;
        let status = if cancelled {
            ForkStatus::Cancelled
        } else {
            ForkStatus::Failed
        };
        for f in &mut s.forks {
            f.status = status as i32;
            f.phase = phase::DONE.into();
            f.error.clone_from(&msg);
        }
    });
    if cancelled {
        WorkflowTermination::cancelled()
    } else {
        ApplicationFailure::non_retryable(msg).into()
    }
}

/// How a prepared fork's child ended, or an inline fork's agent.
enum ChildOutcome {
    Finished(Box<ForkResult>),
    /// An inline fork's agent (and verify) ended: it finishes with its batch.
    AgentDone(Box<AgentDone>),
    /// The child never started (the fork was cancelled first): what it was prepared
    /// with is still the run's to give back.
    NotStarted(Box<(WaveFork, Prepared, StepFailure)>),
}

/// The result of a fork that stopped before its child ran.
fn not_started(
    ctx: &WorkflowContext<SandboxOrchestrationWorkflow>,
    input: &ForkInput,
    why: StepFailure,
) -> ForkResult {
    let budget = matches!(why, StepFailure::BudgetExceeded(_));
    let mut r = ForkResult {
        fork: input.fork,
        started_unix_ms: input.started_unix_ms,
        finished_unix_ms: unix_ms(ctx.workflow_time()),
        // A refused reservation: the run re-queues the fork until a raise (`record`).
        phase: if budget {
            phase::AWAITING_BUDGET
        } else {
            phase::DONE
        }
        .into(),
        ..Default::default()
    };
    apply_failure(&mut r, why);
    r
}

/// Run a prepared fork: inline (`RunSpec::inline_forks`), or in a child of its own.
fn start_fork<'a>(
    ctx: &'a WorkflowContext<SandboxOrchestrationWorkflow>,
    f: WaveFork,
    prepared: Prepared,
) -> LocalBoxFuture<'a, (u32, ChildOutcome)> {
    if !f.input.spec.inline_forks {
        let input = inline::input_for(&f, &prepared);
        return run_child(ctx, f, prepared, input);
    }
    let fork = f.input.fork;
    Box::pin(async move {
        let done = inline::agent(ctx, f, prepared).await;
        (fork, ChildOutcome::AgentDone(Box::new(done)))
    })
}

/// Start a prepared fork's child (or an inline fork's, for its handoff) and wait for
/// its result.
fn run_child<'a>(
    ctx: &'a WorkflowContext<SandboxOrchestrationWorkflow>,
    f: WaveFork,
    prepared: Prepared,
    input: ForkInput,
) -> LocalBoxFuture<'a, (u32, ChildOutcome)> {
    let fork = f.input.fork;
    if input.handoff.is_none() {
        ctx.state_mut(|s| s.set_fork_phase(fork, phase::AGENT));
    }
    let opts = ChildWorkflowOptions::builder()
        .workflow_id(f.child_id.clone())
        .parent_close_policy(ParentClosePolicy::RequestCancel)
        .cancel_type(ChildWorkflowCancellationType::WaitCancellationCompleted)
        .cancellation_token(f.cancel.clone())
        .build();
    Box::pin(async move {
        let started = match ctx
            .start_child_workflow(ForkWorkflow::run, input, opts)
            .await
        {
            Ok(started) => started,
            Err(e) => {
                let why = if f.cancel.is_cancelled() {
                    StepFailure::Cancelled
                } else {
                    StepFailure::Failed(format!("start fork workflow: {e}"))
                };
                return (fork, ChildOutcome::NotStarted(Box::new((f, prepared, why))));
            }
        };
        let result = started.result().await.unwrap_or_else(|e| {
            // A child that failed or was terminated has settled nothing: the janitor
            // reaps its sandbox and releases its reservation once it has closed.
            let why = if f.cancel.is_cancelled() {
                StepFailure::Cancelled
            } else {
                StepFailure::Failed(e.to_string())
            };
            ForkResult {
                sandbox_id: prepared.sandbox.id.clone(),
                ..not_started(ctx, &f.input, why)
            }
        });
        (fork, ChildOutcome::Finished(Box::new(result)))
    })
}

/// Keep the `ForkyardRunState` search attribute in step, so ListRuns can filter on it.
fn publish_state(ctx: &WorkflowContext<SandboxOrchestrationWorkflow>, published: &mut String) {
    let state = ctx.state(|s| s.live_state()).as_str_name().to_owned();
    if *published != state {
        let labels = ctx.state(|s| {
            let mut l: Vec<String> = s
                .spec
                .labels
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            l.sort();
            l
        });
        let mut updates = vec![RUN_STATE_ATTR.value_set(state.clone())];
        if published.is_empty() {
            updates.push(LABELS_ATTR.value_set(labels));
        }
        ctx.upsert_search_attributes(updates);
        *published = state;
    }
}

impl SandboxOrchestrationWorkflow {
    fn has_pending(&self) -> bool {
        self.forks
            .iter()
            .any(|f| f.status == ForkStatus::Pending as i32)
    }

    fn winner_found(&self) -> bool {
        self.spec.stop_on_first_verified
            && self
                .forks
                .iter()
                .any(|f| f.verify == VerifyStatus::Passed as i32)
    }

    /// The next pending fork, marked running, with its attempt number.
    /// What a fork's start reserves: its budget, less what its earlier starts spent.
    fn reservation_for(&self, fork: u32) -> i64 {
        let spent = if self.within_budget {
            self.earlier_cost.get(&fork).map_or(0, |c| c.0)
        } else {
            0
        };
        self.spec.fork_budget_micros - spent
    }

    fn next_startable(&mut self) -> Option<(u32, u32)> {
        if self.paused || self.awaiting_budget || self.winner_found() {
            return None;
        }
        let f = self
            .forks
            .iter_mut()
            .find(|f| f.status == ForkStatus::Pending as i32)?;
        f.status = ForkStatus::Running as i32;
        f.phase = phase::RESERVING.into();
        f.error.clear();
        let i = (f.fork - 1) as usize;
        self.attempts[i] += 1;
        Some((f.fork, self.attempts[i]))
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

    fn record(&mut self, fork: u32, result: ForkResult) {
        let i = (fork - 1) as usize;
        let branch = std::mem::take(&mut self.forks[i].branch);
        let requeue = result.phase == phase::AWAITING_BUDGET
            && result.status == ForkStatus::BudgetExceeded as i32;
        let lost = self.requeue_lost
            && result.status == ForkStatus::Failed as i32
            && result.error.contains(SANDBOX_LOST)
            && self.lost[i] < MAX_LOST_SANDBOX_STARTS;
        let mut slot = compact(result);
        slot.fork = fork;
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
        if slot.branch.is_empty() {
            slot.branch = branch;
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
            // Best-of-N early stop: the others are not needed any more.
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
    }

    fn live_state(&self) -> RunState {
        if self.awaiting_budget {
            RunState::AwaitingBudget
        } else if self.paused {
            RunState::Paused
        } else {
            RunState::Running
        }
    }

    /// Best first: verified, then cheaper, then smaller patch (then fork number).
    fn ranking(&self) -> Vec<u32> {
        let mut ranked: Vec<&ForkResult> = self
            .forks
            .iter()
            .filter(|f| f.status == ForkStatus::Succeeded as i32)
            .collect();
        ranked.sort_by_key(|f| {
            (
                f.verify != VerifyStatus::Passed as i32,
                f.cost_micros,
                f.patch_bytes,
                f.fork,
            )
        });
        ranked.into_iter().map(|f| f.fork).collect()
    }

    fn snapshot(&self) -> Run {
        let count =
            |st: ForkStatus| self.forks.iter().filter(|f| f.status == st as i32).count() as u32;
        let ranking = self.ranking();
        // With a verify command only a verified fork can win.
        let winner = ranking
            .first()
            .copied()
            .filter(|w| {
                self.spec.verify_command.trim().is_empty()
                    || self.forks[(*w - 1) as usize].verify == VerifyStatus::Passed as i32
            })
            .unwrap_or(0);
        let (running, pending, succeeded) = (
            count(ForkStatus::Running),
            count(ForkStatus::Pending),
            count(ForkStatus::Succeeded),
        );
        Run {
            state: self.live_state() as i32,
            spec: Some(self.spec.clone()),
            forks: self.forks.clone(),
            cost_micros: self.forks.iter().map(|f| f.cost_micros).sum(),
            forks_succeeded: succeeded,
            forks_failed: self.forks.len() as u32 - succeeded - running - pending,
            forks_running: running,
            forks_pending: pending,
            started_unix_ms: self.started_unix_ms,
            finished_unix_ms: self.finished_unix_ms,
            error: self.error.clone(),
            budget_micros: self.budget_micros,
            ranking,
            winner,
            ..Default::default()
        }
    }
}

/// How a run whose workflow completed ended: FAILED, with the reason, when it had forks
/// and none succeeded (every one failed, timed out, ran out of budget or was cancelled);
/// COMPLETED otherwise. A cancelled run is CANCELLED by its workflow's own status.
pub fn outcome(run: &Run) -> (RunState, String) {
    if run.forks.is_empty() || run.forks_succeeded > 0 {
        return (RunState::Completed, String::new());
    }
    let first = run
        .forks
        .iter()
        .find(|f| !f.error.is_empty())
        .map(|f| format!("; fork {}: {}", f.fork, f.error))
        .unwrap_or_default();
    (
        RunState::Failed,
        format!("no fork succeeded ({} forks){first}", run.forks.len()),
    )
}
