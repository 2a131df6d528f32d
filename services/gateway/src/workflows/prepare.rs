//! A fork's first and last steps, shared by the run and the fork workflows.
//!
//! The run workflow prepares its forks itself before it starts their children:
//! reserve budget → create sandbox → health check, a wave of forks at a time in one local
//! activity (see `crate::activities::wave` and [`prepare_wave`]). So the way from `LaunchRun` to a
//! ready sandbox holds no child-workflow start and no matched activity task, and the
//! child's history starts at the agent. What prepare made is never lost: the wave's
//! activity runs on a detached cancellation token and answers for every fork what it
//! holds, and a fork cancelled (or failed) before its child started has its sandbox
//! destroyed and its reservation released here.
//!
//! The wave touches one part of the run's state, and only through [`OpensAccount`]:
//! the run's ledger account, which the first wave opens and a RaiseBudget waits for.

use super::{
    failure::{StepFailure, classify},
    input::{ForkInput, step_key},
    join::join_all,
    options, settle,
};
use crate::activities::{
    host::WaveLocal,
    wave::{AccountOpen, ForkPrepared, Wave, WaveItem},
};
use forkyard_proto::{activities::Ledger, sandbox::v1::Sandbox};
use std::time::Duration;
use temporalio_workflow::{WorkflowCancellationToken, WorkflowContext};

mod items;
mod steps;

use items::{moved_on, round_items};
use steps::{Step, advance, held};

/// Forks per preparation activity.
const CHUNK: usize = 100;

/// What prepare hands to the fork's child.
pub(super) struct Prepared {
    pub reservation_id: String,
    pub sandbox: Sandbox,
    pub ready_unix_ms: i64,
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

/// The run's ledger account while its first wave is to open it (runs that take
/// [`Change::AccountOpenedWithFirstWave`](super::patches::Change)): RaiseBudget waits
/// until it is open, or until `error` says why it never will be.
#[derive(Default)]
pub(super) struct AccountOpening {
    pub to_open: Option<AccountOpen>,
    pub error: Option<String>,
}

/// A workflow whose waves may open its account. The run's state is shared with its
/// update handler, so the wave records the opening there as soon as it is known.
pub(super) trait OpensAccount {
    fn account(&mut self) -> &mut AccountOpening;
    /// A fork whose create `from` refused goes to the next backend with room, if any
    /// (`workflows::placement`).
    fn move_fork(&mut self, fork: u32, from: &str) -> Option<String>;
    /// None after `from` has room: the fork is to wait for room on the backends after
    /// it, if any (their names).
    fn wait_for_room(&mut self, fork: u32, from: &str) -> Option<String>;
}

/// How a wave is prepared, decided by the run (the patches its history takes).
#[derive(Clone, Copy)]
pub(super) struct WavePlan {
    /// A regular activity instead of a local one (a later wave).
    pub as_activity: bool,
    /// The longer retry rounds ([`PATIENT_ROUNDS`]).
    pub outlasts_an_outage: bool,
    /// Creates a draining replica refused go on past the rounds, for as long as the
    /// fork's timeout (`Change::FinishesBesideWaves`).
    pub waits_out_drains: bool,
    /// Sandboxes on the run's backend (`Change::BackendPerRun`); else on local, as
    /// every run of earlier builds was.
    pub backend_per_run: bool,
    /// A create its backend refused moves the fork to the run's next backend
    /// (`Change::SeveralBackends`, a run with `RunSpec.backends`).
    pub fails_over: bool,
    /// A refused fork with no room after its backend waits for room there, and a retry
    /// stays on the backend it was moved to (`Change::RefusedForkWaits`).
    pub waits_for_room: bool,
}

impl WavePlan {
    fn rounds(self) -> u32 {
        if self.outlasts_an_outage {
            PATIENT_ROUNDS
        } else {
            ROUNDS
        }
    }
}

/// Open the run's ledger account in a local activity of its own (runs of earlier
/// builds, and a first wave of more than one activity); the error is the run's.
pub(super) async fn open_account<W>(
    ctx: &WorkflowContext<W>,
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
        .map_err(|e| format!("{}: {e}", crate::activities::wave::step::OPEN))
}

/// Reserve, create and check the sandboxes of a wave of forks (the forks the run starts
/// at one time) in one local activity (`crate::activities::wave`), then give back what the forks
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
pub(super) async fn prepare_wave<W: OpensAccount>(
    ctx: &WorkflowContext<W>,
    wave: &[WaveFork],
    plan: WavePlan,
) -> Vec<Result<Prepared, StepFailure>> {
    let mut steps: Vec<Step> = wave
        .iter()
        .map(|_| Step::Todo {
            reservation_id: String::new(),
            on: None,
        })
        .collect();
    let rounds = plan.rounds();
    let started = ctx.workflow_time();
    let mut round = 0;
    // Every fork still to prepare was just moved to another backend: nothing to wait out.
    let mut only_moved = false;
    loop {
        if round > 0 && !only_moved && steps.iter().any(|s| matches!(s, Step::Todo { .. })) {
            // Cancelled with the run: the forks then stop as cancelled below.
            let _ = ctx.timer(backoff(round)).await;
        }
        let (todo, items) = round_items(wave, &mut steps, plan.backend_per_run);
        if todo.is_empty() {
            break;
        }
        let Some(outcomes) = prepare_round(ctx, &items, plan.as_activity).await else {
            // The run's account could not be opened: the run fails.
            return wave
                .iter()
                .map(|_| Err(StepFailure::Failed(String::new())))
                .collect();
        };
        let last = round + 1 >= rounds;
        // Past the rounds, only a create a draining replica refused goes on: the
        // replica's restart (or another) will take it, within the fork's timeout.
        let waits = plan.waits_out_drains && within_fork_timeout(ctx, started, wave);
        let mut moved = Vec::new();
        for (i, outcome) in todo.into_iter().zip(outcomes) {
            if moved_on(ctx, plan, &wave[i], &mut steps[i], &outcome, last) {
                moved.push(i);
                continue;
            }
            advance(&wave[i], &mut steps[i], outcome, last, waits, plan);
        }
        only_moved = !moved.is_empty()
            && steps
                .iter()
                .enumerate()
                .all(|(i, s)| !matches!(s, Step::Todo { .. }) || moved.contains(&i));
        round += 1;
    }
    give_back(ctx, wave, &steps).await;
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

/// One round: at most [`CHUNK`] forks per activity, all started at once (its result,
/// about 1 KB a fork, is one payload in the run's history, kept far below Temporal's
/// limits). The run's account, when still to open, is opened by the round's one
/// activity, beside its creates; before a round of several (each one's reserves need
/// it). `None`: it could not be opened.
async fn prepare_round<W: OpensAccount>(
    ctx: &WorkflowContext<W>,
    items: &[WaveItem],
    as_activity: bool,
) -> Option<Vec<Result<ForkPrepared, StepFailure>>> {
    let chunks: Vec<Vec<WaveItem>> = items.chunks(CHUNK).map(<[WaveItem]>::to_vec).collect();
    let mut open = ctx.state_mut(|s| s.account().to_open.clone());
    if chunks.len() > 1
        && let Some(o) = open.take()
    {
        if let Err(e) = open_account(ctx, o).await {
            ctx.state_mut(|s| s.account().error = Some(e));
            return None;
        }
        ctx.state_mut(|s| s.account().to_open = None);
    }
    let runs = chunks.into_iter().map(|forks| {
        let open = open.take();
        async move { prepare_chunk(ctx, forks, open, as_activity).await }
    });
    Some(join_all(runs).await.into_iter().flatten().collect())
}

/// One activity of a round: every fork's outcome, in order.
async fn prepare_chunk<W: OpensAccount>(
    ctx: &WorkflowContext<W>,
    forks: Vec<WaveItem>,
    open: Option<AccountOpen>,
    as_activity: bool,
) -> Vec<Result<ForkPrepared, StepFailure>> {
    let asked = forks.len();
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
            let account = s.account();
            if error.is_none() {
                account.to_open = None;
            }
            account.error = error;
        });
    }
    match done {
        Ok(d) if d.forks.len() == asked => d.forks.into_iter().map(Ok).collect(),
        Ok(d) => {
            let why = format!("prepare forks: {} answers for {asked} forks", d.forks.len());
            (0..asked)
                .map(|_| Err(StepFailure::Failed(why.clone())))
                .collect()
        }
        Err(e) => (0..asked)
            .map(|_| Err(classify("prepare forks", &e)))
            .collect(),
    }
}

/// Give back what the stopped forks hold: sandboxes first, then reservations.
async fn give_back<W>(ctx: &WorkflowContext<W>, wave: &[WaveFork], steps: &[Step]) {
    let destroys = steps.iter().map(|step| async move {
        if let Step::Failed {
            sandbox: Some(sb), ..
        } = step
        {
            let _ = settle::destroy(ctx, sb, "fork did not start", false).await;
        }
    });
    join_all(destroys).await;
    let releases = wave.iter().zip(steps).map(|(f, step)| async move {
        if let Step::Failed {
            reservation_id: Some(id),
            ..
        } = step
        {
            let key = step_key(&f.child_id, f.input.attempt, "release");
            settle::release(ctx, &key, id).await;
        }
    });
    join_all(releases).await;
}

/// Whether the wave has been preparing for less than its forks' timeout.
fn within_fork_timeout<W>(
    ctx: &WorkflowContext<W>,
    started: Option<std::time::SystemTime>,
    wave: &[WaveFork],
) -> bool {
    let limit = wave
        .first()
        .map_or(0, |f| u64::from(f.input.spec.fork_timeout_secs));
    match (started, ctx.workflow_time()) {
        (Some(a), Some(b)) => b
            .duration_since(a)
            .is_ok_and(|waited| waited < Duration::from_secs(limit)),
        _ => false,
    }
}
