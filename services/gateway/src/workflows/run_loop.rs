//! The run workflow's run: open the run's account (or leave it to the first wave), then
//! keep at most `max_concurrent` forks in flight until every fork has a result, then
//! publish how the run ended. See `orchestration` for the whole design.

mod events;
mod finished;

use events::Event;

use super::{
    RUN_STATE_ATTR,
    input::ForkInput,
    patches::{Change, Patches},
    phase,
    prepare::{self, WaveFork, WavePlan, prepare_wave},
    run_state::{SandboxOrchestrationWorkflow, outcome},
    start::{InFlight, child_id, not_started, start_fork},
};
use crate::activities::wave::AccountOpen;
use forkyard_common::clock::unix_ms;
use forkyard_proto::{
    budget::v1::{AccountKind, CreateAccountRequest, OpenAccountRequest},
    gateway::v1::{Run, RunSpec},
};
use std::collections::BTreeMap;
use temporalio_common::error::ApplicationFailure;
use temporalio_workflow::{
    WorkflowCancellationToken, WorkflowContext, WorkflowResult, WorkflowTermination,
};

type Ctx = WorkflowContext<SandboxOrchestrationWorkflow>;

pub(super) async fn run(ctx: &mut Ctx) -> WorkflowResult<Run> {
    // First, before any await (see `patches`).
    let patches = Patches::decide(ctx);
    let run_id = ctx.workflow_id().to_owned();
    let spec = ctx.state(|s| s.spec.clone());
    let started = unix_ms(ctx.workflow_time());
    ctx.state_mut(|s| {
        s.started_unix_ms = started;
        s.patches = patches;
    });
    let open = account_open(&run_id, &spec);
    if patches.takes(ctx, Change::AccountOpenedWithFirstWave) {
        // Opened by the first wave's activity, beside its sandboxes' creates.
        ctx.state_mut(|s| s.account.to_open = Some(open));
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
    let fork_trees = super::branching::takes_fork_trees(ctx);
    ctx.state_mut(|s| s.fork_trees = fork_trees);
    let cancel = ctx.cancellation_token();
    let mut flight = Flight::new(ctx, run_id, spec);
    let flown = flight.fly_and_branch(&cancel).await;
    drop(flight);
    // A run's snapshots go with it, however it ends (fork trees).
    super::branching::remove_snapshots(ctx).await;
    flown?;
    if !cancel.is_cancelled() && patches.takes(ctx, Change::DeliversResults) {
        super::deliver::deliver(ctx).await;
    }
    end(ctx, patches, &cancel)
}

/// How the run's ledger account is opened: its own, or a run account under its tenant's
/// (whose spending limit it draws on too).
fn account_open(run_id: &str, spec: &RunSpec) -> AccountOpen {
    if spec.tenant_account_id.is_empty() {
        AccountOpen::Open(OpenAccountRequest {
            account_id: run_id.to_owned(),
            budget_micros: spec.budget_micros,
            idempotency_key: format!("{run_id}/open-account"),
        })
    } else {
        AccountOpen::Create(CreateAccountRequest {
            account_id: run_id.to_owned(),
            kind: AccountKind::Run as i32,
            parent_account_id: spec.tenant_account_id.clone(),
            budget_micros: spec.budget_micros,
            idempotency_key: format!("{run_id}/open-account"),
            ..Default::default()
        })
    }
}

/// The run once every fork has a result (or it was cancelled).
fn end(ctx: &Ctx, patches: Patches, cancel: &WorkflowCancellationToken) -> WorkflowResult<Run> {
    let now = unix_ms(ctx.workflow_time());
    if cancel.is_cancelled() {
        ctx.state_mut(|s| s.cancel_pending(now));
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

/// A run whose account could not be opened: every fork ends with the reason (cancelled,
/// when the run was cancelled meanwhile), and so does the run.
fn fail_unopened(ctx: &Ctx, e: String) -> WorkflowTermination {
    let cancelled = ctx.cancellation_token().is_cancelled();
    let msg = if cancelled {
        "run cancelled".to_owned()
    } else {
        e
    };
    let now = unix_ms(ctx.workflow_time());
    ctx.state_mut(|s| s.end_every_fork(&msg, cancelled, now));
    if cancelled {
        WorkflowTermination::cancelled()
    } else {
        ApplicationFailure::non_retryable(msg).into()
    }
}

/// The forks in flight, and what the run loop keeps beside them.
struct Flight<'a> {
    ctx: &'a Ctx,
    run_id: String,
    spec: RunSpec,
    max_concurrent: usize,
    in_flight: Vec<InFlight<'a>>,
    /// Each running fork's own token: its preparation and its steps stop on it.
    tokens: BTreeMap<u32, WorkflowCancellationToken>,
    /// The run state last published as a search attribute.
    published: String,
    /// The wave being prepared beside the forks in flight
    /// ([`Change::FinishesBesideWaves`]).
    preparing: Option<Preparing<'a>>,
    /// The run takes [`Change::FinishesBesideWaves`].
    beside: bool,
    /// The run is over several backends and takes [`Change::SeveralBackends`]: each
    /// fork is placed on one with room (`workflows::placement`).
    several: bool,
}

/// A wave's preparation, owning its forks: they come back with their outcomes.
type Preparing<'a> = std::pin::Pin<
    Box<
        dyn std::future::Future<
                Output = (
                    Vec<WaveFork>,
                    Vec<Result<prepare::Prepared, super::failure::StepFailure>>,
                ),
            > + 'a,
    >,
>;

/// Forks in flight at most. A run open for branches or searching takes its spec's figure
/// as it is: its forks grow with its branches (the gateway keeps the launch's figure for those).
/// Deterministic for runs already in flight: every run before this had a spec no larger
/// than its forks (the gateway clamped it at launch), so both arms give it the same.
fn max_concurrent(spec: &RunSpec) -> usize {
    if crate::validate::grows(spec) {
        spec.max_concurrent.max(1) as usize
    } else {
        spec.max_concurrent.clamp(1, spec.forks.max(1)) as usize
    }
}

impl<'a> Flight<'a> {
    fn new(ctx: &'a Ctx, run_id: String, spec: RunSpec) -> Self {
        Self {
            ctx,
            run_id,
            max_concurrent: max_concurrent(&spec),
            spec,
            in_flight: Vec::new(),
            tokens: BTreeMap::new(),
            published: String::new(),
            preparing: None,
            beside: ctx
                .state(|s| s.patches)
                .takes(ctx, Change::FinishesBesideWaves),
            several: !spec_backends_empty(ctx)
                && ctx.state(|s| s.patches).takes(ctx, Change::SeveralBackends),
        }
    }

    /// [`Self::fly`], then again for each round of the run's search and each branch
    /// taken in its branch window.
    async fn fly_and_branch(
        &mut self,
        cancel: &WorkflowCancellationToken,
    ) -> Result<(), WorkflowTermination> {
        loop {
            self.fly(cancel).await?;
            if !cancel.is_cancelled() && self.ctx.state_mut(|s| s.next_search_round()) {
                continue;
            }
            if !super::branching::wait_for_branches(self.ctx, cancel).await {
                return Ok(());
            }
        }
    }

    /// Until every fork has a result, or the run is cancelled and its forks are done.
    async fn fly(&mut self, cancel: &WorkflowCancellationToken) -> Result<(), WorkflowTermination> {
        loop {
            self.publish_state();
            // Start what may start: prepare them as one wave, then start their steps;
            // beside the forks in flight where the run takes that change.
            if self.preparing.is_none() {
                let wave = self.next_wave(cancel);
                if !wave.is_empty() && self.beside {
                    self.begin_wave(wave);
                } else if !wave.is_empty() {
                    self.start_wave(wave).await?;
                    continue;
                }
            }
            self.pass_on_cancels();
            if self.in_flight.is_empty() && self.preparing.is_none() {
                if !self.wait_while_held(cancel).await {
                    return Ok(());
                }
                continue;
            }
            match self.next_event().await {
                Event::Finished(finished) => self.take_finished(finished).await,
                Event::Prepared(wave, outcomes) => {
                    self.preparing = None;
                    self.start_prepared(wave, outcomes)?;
                }
                Event::Changed => {}
            }
        }
    }

    /// The forks that may start now, each marked running with a token of its own.
    fn next_wave(&mut self, cancel: &WorkflowCancellationToken) -> Vec<WaveFork> {
        let ctx = self.ctx;
        let mut wave = Vec::new();
        while self.in_flight.len() + wave.len() < self.max_concurrent && !cancel.is_cancelled() {
            // A run over several backends starts a fork only where one has room for it.
            let (fork, attempt, room) = if self.several {
                let Some((fork, attempt, b)) = ctx.state_mut(|s| s.next_placed()) else {
                    break;
                };
                (fork, attempt, Some(b))
            } else {
                let Some((fork, attempt)) = ctx.state_mut(|s| s.next_startable()) else {
                    break;
                };
                (fork, attempt, None)
            };
            let mut spec = self.spec.clone();
            if let Some(b) = room {
                // The fork's own copy names where it goes (its create, its result).
                spec.backend = b;
            }
            let input = ForkInput {
                run_id: self.run_id.clone(),
                fork,
                attempt,
                spec,
                reservation_micros: ctx.state(|s| s.reservation_for(fork)),
                started_unix_ms: unix_ms(ctx.workflow_time()),
                branch: ctx.state(|s| s.branches.get(&fork).cloned()),
                ..ForkInput::default()
            };
            let token = ctx.cancellation_token().child_token();
            self.tokens.insert(fork, token.clone());
            wave.push(WaveFork {
                child_id: child_id(&self.run_id, fork),
                input,
                cancel: token,
            });
        }
        wave
    }

    /// Prepare a wave, then start the steps of its forks that are ready (runs before
    /// [`Change::FinishesBesideWaves`]: nothing else goes on meanwhile).
    async fn start_wave(&mut self, wave: Vec<WaveFork>) -> Result<(), WorkflowTermination> {
        let ctx = self.ctx;
        let plan = self.wave_begins(&wave);
        let outcomes = prepare_wave(ctx, &wave, plan).await;
        self.start_prepared(wave, outcomes)
    }

    /// Begin preparing a wave; the run loop goes on with the forks in flight and starts
    /// the wave's forks when it is ready ([`Event::Prepared`]).
    fn begin_wave(&mut self, wave: Vec<WaveFork>) {
        let ctx = self.ctx;
        let plan = self.wave_begins(&wave);
        self.preparing = Some(Box::pin(async move {
            let outcomes = prepare_wave(ctx, &wave, plan).await;
            (wave, outcomes)
        }));
    }

    /// The wave's forks are creating; how it is prepared.
    fn wave_begins(&self, wave: &[WaveFork]) -> WavePlan {
        let ctx = self.ctx;
        let plan = wave_plan(ctx);
        ctx.state_mut(|s| {
            for f in wave {
                s.set_fork_phase(f.input.fork, phase::CREATING);
            }
        });
        plan
    }

    /// Start the steps of a prepared wave's ready forks; record why the others did not.
    fn start_prepared(
        &mut self,
        wave: Vec<WaveFork>,
        outcomes: Vec<Result<prepare::Prepared, super::failure::StepFailure>>,
    ) -> Result<(), WorkflowTermination> {
        let ctx = self.ctx;
        if let Some(e) = ctx.state(|s| s.account.error.clone()) {
            // Its forks' sandboxes are destroyed; nothing was reserved.
            return Err(fail_unopened(ctx, e));
        }
        for (f, outcome) in wave.into_iter().zip(outcomes) {
            let fork = f.input.fork;
            match outcome {
                Ok(prepared) => {
                    if crate::validate::grows(&self.spec) {
                        let owner = prepared.sandbox.owner_endpoint.clone();
                        ctx.state_mut(|s| s.owners.insert(fork, owner));
                    }
                    self.in_flight.push(start_fork(ctx, f, prepared));
                }
                Err(super::failure::StepFailure::WaitsForRoom(why)) => {
                    // Pending again; the next wave takes it once a backend has room.
                    self.tokens.remove(&fork);
                    ctx.state_mut(|s| s.pend_for_room(fork, why));
                }
                Err(why) => {
                    self.tokens.remove(&fork);
                    let mut result = not_started(ctx, &f.input, why);
                    // Where it was placed last (moved on after a refusal, or not).
                    result.backend = ctx.state(|s| s.placed_on(fork));
                    ctx.state_mut(|s| s.record(fork, result));
                }
            }
        }
        Ok(())
    }

    /// Cancellations asked for by CancelFork or an early stop, to the forks' tokens.
    fn pass_on_cancels(&self) {
        for fork in self
            .ctx
            .state_mut(|s| std::mem::take(&mut s.cancel_requests))
        {
            if let Some(t) = self.tokens.get(&fork) {
                t.cancel_with_reason("fork cancelled");
            }
        }
    }
}

/// How the next wave is prepared. Only the first wave runs while nothing else is in
/// flight (its latency is the run's); later ones are regular activities. A patch: more
/// rounds are more timers, which histories of earlier builds lack.
fn wave_plan(ctx: &Ctx) -> WavePlan {
    let patches = ctx.state(|s| s.patches);
    let as_activity =
        ctx.state(|s| s.first_wave_prepared) && patches.takes(ctx, Change::LaterWavesAreActivities);
    ctx.state_mut(|s| s.first_wave_prepared = true);
    WavePlan {
        as_activity,
        outlasts_an_outage: patches.takes(ctx, Change::PrepareOutlastsAnOutage),
        waits_out_drains: patches.takes(ctx, Change::FinishesBesideWaves),
        backend_per_run: patches.takes(ctx, Change::BackendPerRun),
        fails_over: patches.takes(ctx, Change::SeveralBackends),
        waits_for_room: patches.takes(ctx, Change::RefusedForkWaits),
    }
}

fn spec_backends_empty(ctx: &Ctx) -> bool {
    ctx.state(|s| s.spec.backends.is_empty())
}
