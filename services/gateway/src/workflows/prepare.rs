//! A fork's first and last steps, shared by the run and the fork workflows.
//!
//! The run workflow prepares its forks itself before it starts their children:
//! reserve budget → create sandbox → health check, a wave of forks at a time in one local
//! activity (see `crate::wave` and [`prepare_wave`]). So the way from `LaunchRun` to a
//! ready sandbox holds no child-workflow start and no matched activity task, and the
//! child's history starts at the agent. What prepare made is never lost: the wave's
//! activity runs on a detached cancellation token and answers for every fork what it
//! holds, and a fork cancelled (or failed) before its child started has its sandbox
//! destroyed and its reservation released here.
//!
//! Settlement and destroy are the last steps of whichever workflow runs the fork's steps
//! (`fork`, `inline`), and the run's for a fork that never got that far.

use super::{
    failure::{StepFailure, classify, refused, retryable},
    fork::{ForkInput, Progress, failure_message},
    options,
    orchestration::SandboxOrchestrationWorkflow,
    patches::{Change, Patches},
    phase,
};
use crate::{
    sandboxes::{AtOwner, SandboxLocal},
    wave::{AccountOpen, ForkPrepared, Wave, WaveItem, WaveLocal},
};
use forkyard_proto::{
    activities::Ledger,
    budget::v1::{CommitRequest, ReleaseRequest, Reservation, ReserveRequest},
    common::v1::{ForkResult, ForkStatus},
    labels,
    sandbox::v1::{CreateSandboxRequest, DestroySandboxResponse, Sandbox},
};
use std::{collections::HashMap, future::Future, pin::Pin, task::Poll, time::Duration};
use temporalio_workflow::{
    WorkflowCancellationToken, WorkflowContext, common::error::ActivityExecutionError,
};

/// What prepare hands to the fork's child.
pub(super) struct Prepared {
    pub reservation_id: String,
    pub sandbox: Sandbox,
    pub ready_unix_ms: i64,
}

/// The idempotency key of a fork's step: `<run>/fork-<n>/a<attempt>/<step>` (the same
/// keys whichever workflow runs the step, so a retried step never applies twice).
pub(super) fn step_key(child_id: &str, attempt: u32, step: &str) -> String {
    format!("{child_id}/a{}/{step}", attempt.max(1))
}

/// One fork of a wave: what it needs, its child's id and its own cancellation token
/// (cancelled by CancelFork, an early stop or the run's cancellation).
pub(super) struct WaveFork {
    pub input: ForkInput,
    pub child_id: String,
    pub cancel: WorkflowCancellationToken,
}

impl WaveFork {
    /// The workflow that settles the fork's reservation and destroys its sandbox: its
    /// child, or the run itself for an inline fork (it hands both over to a child only
    /// while it waits for that child).
    pub(super) fn owner(&self) -> &str {
        if self.input.spec.inline_forks {
            &self.input.run_id
        } else {
            &self.child_id
        }
    }
}

/// Where one fork of a wave is while it is prepared.
enum Step {
    /// Still to prepare (again), with the reservation an earlier round made.
    Todo {
        reservation_id: String,
    },
    Ready(Prepared),
    /// Stopped; what it holds is given back in the wave's cleanup stages.
    Failed {
        reservation_id: Option<String>,
        sandbox: Option<Sandbox>,
        why: StepFailure,
    },
}

/// Rounds of a wave's preparation: the first, then the retries of forks whose step may
/// succeed later, 5 s and then 10 s after (the seed's create policy, 3×/5 s/×2).
const ROUNDS: u32 = 3;
/// Runs started by builds with the `prepare-outlasts-an-outage` patch go on longer:
/// 5, 10, 20, 40, 60 and 60 s apart, about three minutes in all, so a provisioner fleet
/// (or the ledger) away for a minute delays its forks instead of failing them (a chaos
/// trial: every provisioner down for 60 s mid-run).
const PATIENT_ROUNDS: u32 = 7;

/// The wait before round `round` (from 1).
fn backoff(round: u32) -> Duration {
    Duration::from_secs((5u64 << (round - 1).min(4)).min(60))
}

/// Forks per preparation activity.
const CHUNK: usize = 100;

/// Open the run's ledger account in a local activity of its own (runs of earlier
/// builds, and a first wave of more than one activity); the error is the run's.
pub(super) async fn open_account(
    ctx: &WorkflowContext<SandboxOrchestrationWorkflow>,
    open: AccountOpen,
) -> Result<(), String> {
    let opened = match open {
        AccountOpen::Open(req) => {
            ctx.execute_local_activity(Ledger::open_account, req, options::ledger())
                .await
        }
        AccountOpen::Create(req) => {
            ctx.execute_local_activity(Ledger::create_account, req, options::ledger())
                .await
        }
    };
    opened
        .map(drop)
        .map_err(|e| format!("{}: {e}", crate::wave::step::OPEN))
}

/// Reserve, create and check the sandboxes of a wave of forks (the forks the run starts
/// at one time) in one local activity (`crate::wave`), then give back what the forks
/// that stopped hold (destroy, then release).
///
/// Why a whole wave in one local activity and one stage at a time: the Rust SDK replays
/// a workflow's local activities in the order their markers were recorded, but it may
/// hand several results to the workflow in one activation where the first run had them in
/// several (or the other way round). If each fork went on to its next step as soon as its
/// own result came, the order of the next local activities (their sequence numbers) and
/// of the child starts would follow that batching, and a replay (after a gateway crash or
/// a cache eviction) could fail as nondeterministic, or worse hand one fork's result to
/// another. With one activity per round and every later step started in fork order,
/// nothing depends on timing; inside the activity each fork goes on at its own pace.
pub(super) async fn prepare_wave(
    ctx: &WorkflowContext<SandboxOrchestrationWorkflow>,
    wave: &[WaveFork],
) -> Vec<Result<Prepared, StepFailure>> {
    let key = |f: &WaveFork, step: &str| step_key(&f.child_id, f.input.attempt, step);
    let mut steps: Vec<Step> = wave
        .iter()
        .map(|_| Step::Todo {
            reservation_id: String::new(),
        })
        .collect();
    // A patch: more rounds are more timers, which histories of earlier builds lack.
    let patches = ctx.state(|s| s.patches);
    // Only the first wave runs while nothing else is in flight; its latency is the run's.
    let as_activity =
        ctx.state(|s| s.first_wave_prepared) && patches.takes(ctx, Change::LaterWavesAreActivities);
    ctx.state_mut(|s| s.first_wave_prepared = true);
    let rounds = if patches.takes(ctx, Change::PrepareOutlastsAnOutage) {
        PATIENT_ROUNDS
    } else {
        ROUNDS
    };
    for round in 0..rounds {
        if round > 0 && steps.iter().any(|s| matches!(s, Step::Todo { .. })) {
            // Cancelled with the run: the forks then stop as cancelled below.
            let _ = ctx.timer(backoff(round)).await;
        }
        let mut todo = Vec::new();
        let mut items = Vec::new();
        for (i, (f, step)) in wave.iter().zip(steps.iter_mut()).enumerate() {
            let Step::Todo { reservation_id } = step else {
                continue;
            };
            if f.cancel.is_cancelled() {
                *step = Step::Failed {
                    reservation_id: held(std::mem::take(reservation_id)),
                    sandbox: None,
                    why: StepFailure::Cancelled,
                };
                continue;
            }
            ctx.state_mut(|s| s.set_fork_phase(f.input.fork, phase::CREATING));
            todo.push(i);
            items.push(WaveItem {
                reservation_id: reservation_id.clone(),
                reserve: ReserveRequest {
                    account_id: f.input.run_id.clone(),
                    amount_micros: f.input.reservation_micros,
                    holder: f.owner().to_owned(),
                    idempotency_key: key(f, "reserve"),
                },
                create: create_request(f, key(f, "create")),
            });
        }
        if todo.is_empty() {
            break;
        }
        // At most CHUNK forks per activity, all started at once: its result (about 1 KB
        // a fork) is one payload in the run's history, kept far below Temporal's limits.
        let chunks: Vec<Vec<WaveItem>> = items.chunks(CHUNK).map(<[WaveItem]>::to_vec).collect();
        // The run's account, when still to open: by the wave's one activity, beside its
        // creates; before a wave of several (each one's reserves need it).
        let mut open = ctx.state(|s| s.account_to_open.clone());
        if chunks.len() > 1
            && let Some(o) = open.take()
        {
            if let Err(e) = open_account(ctx, o).await {
                ctx.state_mut(|s| s.open_error = Some(e));
                return wave
                    .iter()
                    .map(|_| Err(StepFailure::Failed(String::new())))
                    .collect();
            }
            ctx.state_mut(|s| s.account_to_open = None);
        }
        let runs = chunks.into_iter().map(|forks| {
            let asked = forks.len();
            let open = open.take();
            async move {
                let opens = open.is_some();
                let wave = Wave { forks, open };
                let done = if as_activity {
                    ctx.execute_activity(WaveLocal::prepare, wave, options::wave())
                        .await
                } else {
                    ctx.execute_local_activity(WaveLocal::prepare, wave, options::wave_local())
                        .await
                };
                if opens && let Ok(d) = &done {
                    let error = Some(d.open_error.clone()).filter(|e| !e.is_empty());
                    ctx.state_mut(|s| {
                        if error.is_none() {
                            s.account_to_open = None;
                        }
                        s.open_error = error;
                    });
                }
                let out: Vec<Result<ForkPrepared, StepFailure>> = match done {
                    Ok(d) if d.forks.len() == asked => d.forks.into_iter().map(Ok).collect(),
                    Ok(d) => {
                        let why =
                            format!("prepare forks: {} answers for {asked} forks", d.forks.len());
                        (0..asked)
                            .map(|_| Err(StepFailure::Failed(why.clone())))
                            .collect()
                    }
                    Err(e) => (0..asked)
                        .map(|_| Err(classify("prepare forks", &e)))
                        .collect(),
                };
                out
            }
        });
        let outcomes: Vec<Result<ForkPrepared, StepFailure>> =
            join_all(runs).await.into_iter().flatten().collect();
        let last = round + 1 == rounds;
        for (i, outcome) in todo.into_iter().zip(outcomes) {
            let (f, step) = (&wave[i], &mut steps[i]);
            let Step::Todo { reservation_id } = step else {
                continue;
            };
            let holds = held(std::mem::take(reservation_id));
            *step = match outcome {
                Err(why) => Step::Failed {
                    reservation_id: holds,
                    sandbox: None,
                    why,
                },
                Ok(p) => next_step(f, p, last),
            };
        }
    }

    // Give back what the stopped forks hold: sandboxes first, then reservations.
    let destroys = steps.iter().map(|step| async move {
        if let Step::Failed {
            sandbox: Some(sb), ..
        } = step
        {
            let _ = destroy(ctx, sb, "fork did not start").await;
        }
    });
    join_all(destroys).await;
    let releases = wave.iter().zip(&steps).map(|(f, step)| async move {
        if let Step::Failed {
            reservation_id: Some(id),
            ..
        } = step
        {
            release(ctx, &key(f, "release"), id).await;
        }
    });
    join_all(releases).await;

    steps
        .into_iter()
        .map(|step| match step {
            Step::Ready(p) => Ok(p),
            Step::Failed { why, .. } => Err(why),
            // Every fork left the rounds above ready or failed.
            Step::Todo { .. } => Err(StepFailure::Failed(
                "fork preparation did not finish".into(),
            )),
        })
        .collect()
}

/// A reservation id as a fork holds it: empty is none.
fn held(reservation_id: String) -> Option<String> {
    Some(reservation_id).filter(|r| !r.is_empty())
}

/// Where a fork goes after a round: ready, another round, or stopped.
fn next_step(f: &WaveFork, p: ForkPrepared, last_round: bool) -> Step {
    let reservation_id = held(p.reservation_id);
    if p.step.is_empty() {
        if p.sandbox.is_some() && !f.cancel.is_cancelled() {
            return Step::Ready(Prepared {
                reservation_id: reservation_id.unwrap_or_default(),
                sandbox: p.sandbox.unwrap_or_default(),
                ready_unix_ms: p.ready_unix_ms,
            });
        }
        return Step::Failed {
            reservation_id,
            sandbox: p.sandbox,
            why: cancelled_or_failed(f),
        };
    }
    if p.retryable && !last_round && p.sandbox.is_none() && !f.cancel.is_cancelled() {
        return Step::Todo {
            reservation_id: reservation_id.unwrap_or_default(),
        };
    }
    let why = if f.cancel.is_cancelled() {
        StepFailure::Cancelled
    } else {
        refused(&p.step, Some(&p.error_type), &p.error)
    };
    Step::Failed {
        reservation_id,
        sandbox: p.sandbox,
        why,
    }
}

fn create_request(f: &WaveFork, idempotency_key: String) -> CreateSandboxRequest {
    let spec = &f.input.spec;
    CreateSandboxRequest {
        backend: "local".into(),
        repo: spec.repo.clone(),
        base_ref: spec.base_ref.clone(),
        branch: format!("{}-fork-{}", spec.branch, f.input.fork),
        labels: HashMap::from([
            (labels::RUN_ID.to_owned(), f.input.run_id.clone()),
            (labels::FORK.to_owned(), f.input.fork.to_string()),
            // The child that will own it (until it starts, the janitor keeps a sandbox
            // whose run is running), or the run for an inline fork.
            (labels::WORKFLOW_ID.to_owned(), f.owner().to_owned()),
        ]),
        idempotency_key,
        // The run's egress (its tenant's policy checked at launch); none: the sandbox
        // reaches only the LLM gateway, which every agent command gets.
        network: !spec.egress.is_empty(),
        egress_allow: spec.egress.clone(),
        image: spec.image.clone(),
        ..Default::default()
    }
}

/// Every future's output, in order. Unlike `futures::future::join_all` (which puts more
/// than 30 futures in a `FuturesOrdered` with wakers of its own), it polls each future
/// with the workflow task's waker, the only kind the SDK accepts.
pub(super) async fn join_all<F: Future>(futs: impl IntoIterator<Item = F>) -> Vec<F::Output> {
    let mut futs: Vec<Pin<Box<F>>> = futs.into_iter().map(Box::pin).collect();
    let mut outs: Vec<Option<F::Output>> = futs.iter().map(|_| None).collect();
    std::future::poll_fn(move |cx| {
        let mut pending = false;
        for (fut, out) in futs.iter_mut().zip(outs.iter_mut()) {
            if out.is_none() {
                match fut.as_mut().poll(cx) {
                    Poll::Ready(v) => *out = Some(v),
                    Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            Poll::Pending
        } else {
            Poll::Ready(outs.iter_mut().filter_map(Option::take).collect())
        }
    })
    .await
}

fn cancelled_or_failed(f: &WaveFork) -> StepFailure {
    if f.cancel.is_cancelled() {
        StepFailure::Cancelled
    } else {
        StepFailure::Failed("fork preparation stopped".into())
    }
}

fn at(sandbox: &Sandbox, reason: &str) -> AtOwner {
    AtOwner {
        endpoint: sandbox.owner_endpoint.clone(),
        sandbox_id: sandbox.id.clone(),
        reason: reason.to_owned(),
    }
}

/// Destroy a sandbox at its owner replica, whatever the workflow's cancellation.
pub(super) async fn destroy<W>(
    ctx: &WorkflowContext<W>,
    sandbox: &Sandbox,
    reason: &str,
) -> Result<DestroySandboxResponse, ActivityExecutionError> {
    ctx.execute_local_activity(
        SandboxLocal::destroy,
        at(sandbox, reason),
        options::destroy_local(),
    )
    .await
}

/// Give back a reservation nothing was charged to (best effort: the janitor releases
/// reservations whose holder has closed).
pub(super) async fn release<W>(ctx: &WorkflowContext<W>, key: &str, reservation_id: &str) {
    let release = ReleaseRequest {
        reservation_id: reservation_id.to_owned(),
        idempotency_key: key.to_owned(),
    };
    let _ = ctx
        .execute_local_activity(Ledger::release, release, options::ledger_detached())
        .await;
}

/// Commit what the agent spent, or release the reservation if it spent nothing. A
/// settlement the ledger did not take in time is posted again until it does
/// ([`Change::DurableSettle`]: runs from earlier builds reported such forks FAILED and
/// lost the spend).
pub(super) async fn settle<W>(
    ctx: &WorkflowContext<W>,
    key: &impl Fn(&str) -> String,
    progress: &Progress,
    patches: Patches,
    result: &mut ForkResult,
) {
    let reservation_id = progress.reservation_id.clone();
    let (amount, sandbox) = commit_amount(
        progress.cost_micros,
        progress.sandbox_charged_micros,
        progress.sandbox_cost_micros,
    );
    result.sandbox_cost_micros = sandbox;
    let commit = amount > 0 || result.status == ForkStatus::Succeeded as i32;
    let settlement = Settlement {
        commit,
        reservation_id,
        amount_micros: amount,
        key: key(if commit { "commit" } else { "release" }),
    };
    let answer = if commit {
        let req = settlement.commit_request();
        ctx.execute_local_activity(Ledger::commit, req, options::ledger_detached())
            .await
    } else {
        let req = settlement.release_request();
        ctx.execute_local_activity(Ledger::release, req, options::ledger_detached())
            .await
    };
    let answer = match answer {
        Err(e) if retryable(&e) && patches.takes(ctx, Change::DurableSettle) => {
            settle_durably(ctx, &settlement).await
        }
        a => a.map_err(|e| classify(settlement.step(), &e)),
    };
    apply_settlement(result, amount, commit, answer);
}

/// One fork's settlement: commit what it spent, or release the reservation.
pub(super) struct Settlement {
    pub commit: bool,
    pub reservation_id: String,
    pub amount_micros: i64,
    /// The idempotency key of the first try, so a durable retry posts it once.
    pub key: String,
}

impl Settlement {
    fn step(&self) -> &'static str {
        if self.commit {
            "commit spend"
        } else {
            "release reservation"
        }
    }

    fn commit_request(&self) -> CommitRequest {
        CommitRequest {
            reservation_id: self.reservation_id.clone(),
            amount_micros: self.amount_micros,
            idempotency_key: self.key.clone(),
        }
    }

    fn release_request(&self) -> ReleaseRequest {
        ReleaseRequest {
            reservation_id: self.reservation_id.clone(),
            idempotency_key: self.key.clone(),
        }
    }
}

/// The settlement as a regular activity on the ledger's queue, retried until the ledger
/// takes it ([`options::ledger_durable`]): the fork's result waits for it.
pub(super) async fn settle_durably<W>(
    ctx: &WorkflowContext<W>,
    s: &Settlement,
) -> Result<Reservation, StepFailure> {
    let answer = if s.commit {
        ctx.execute_activity(
            Ledger::commit,
            s.commit_request(),
            options::ledger_durable(),
        )
        .await
    } else {
        ctx.execute_activity(
            Ledger::release,
            s.release_request(),
            options::ledger_durable(),
        )
        .await
    };
    answer.map_err(|e| classify(s.step(), &e))
}

/// What a fork's commit posts, and the sandbox's part of it: the agent's spend (`cost`,
/// of which `sandbox_charged` was sandbox time charged while it ran) with the sandbox's
/// whole cost in place of that part, when it is known (read at patch collection, never
/// less than what was charged for it).
pub fn commit_amount(cost: i64, sandbox_charged: i64, sandbox_cost: Option<i64>) -> (i64, i64) {
    let sandbox = sandbox_cost.unwrap_or(0).max(sandbox_charged);
    (cost - sandbox_charged + sandbox, sandbox)
}

/// The fork's cost (and status) from its settlement: what was committed, or (released)
/// what the agent charged before it stopped, e.g. on budget exceeded, which stays spent.
pub(super) fn apply_settlement(
    result: &mut ForkResult,
    cost_micros: i64,
    committed: bool,
    answer: Result<Reservation, StepFailure>,
) {
    match (committed, answer) {
        (true, Ok(r)) => {
            result.cost_micros = r.committed_micros;
            if r.budget_exceeded {
                result.status = ForkStatus::BudgetExceeded as i32;
                result.error = format!(
                    "agent spent {cost_micros} micro-USD, more than the run's budget allowed ({} charged)",
                    r.committed_micros
                );
            }
        }
        (true, Err(e)) => {
            result.status = ForkStatus::Failed as i32;
            result.error = failure_message(e);
        }
        (false, Ok(r)) => {
            result.cost_micros = r.charged_micros;
            result.sandbox_cost_micros = result.sandbox_cost_micros.min(r.charged_micros);
        }
        (false, Err(e)) if result.error.is_empty() => result.error = failure_message(e),
        (false, Err(_)) => {}
    }
    // The sandbox's part is set before settling (0 until sandbox time is priced): the
    // rest of what the ledger took is the model's.
    result.model_cost_micros = (result.cost_micros - result.sandbox_cost_micros).max(0);
}
