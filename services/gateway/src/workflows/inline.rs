//! Inline forks: a run of up to the gateway's `--inline-fork-limit` forks runs each
//! fork's steps in its own workflow instead of a child's.
//!
//! Why: a child workflow per fork was the largest share of the Temporal server's work
//! per fork (its start, its own workflow tasks, its completion recorded in the run; see
//! docs/performance.md). Inline, a fork adds its agent activity's
//! three events to the run's history, and its last steps share an activity with the
//! other forks that finished in the same batch.
//!
//! How, without making the run's history depend on timing (see `prepare` on why each
//! fork must not start its next local activity when its last one answers):
//! - a fork's agent and verify are regular activities (their completions are history
//!   events, so a replay sees them in the same workflow tasks), with ids
//!   `fork-<n>/a<attempt>/<step>` so the gateway and the janitor can tell them apart;
//! - the run loop gathers the forks whose agent ended in the same activation and
//!   finishes them together in one activity on the gateway's own queue
//!   (`crate::activities::finish`): patch, settle, destroy, chunked so a result
//!   stays far below Temporal's payload limit. Not a local activity: that held the run's
//!   workflow task open while other agents completed, and Temporal force-fails a task
//!   with more than 100 events buffered behind it;
//! - a patch larger than [`PATCH_MAX_BYTES`] is not kept in the run's history: that
//!   fork is handed to a `ForkWorkflow` child (its `handoff`), which collects the whole
//!   patch into its own history, settles and destroys.
//!
//! The run keeps each inline fork's full result (patch and output tails included) in its
//! state for `GetForkResult` (its `fork_result` query); its `progress` stays compact.
//! History: per inline fork its agent's events (and verify's), about 4 with its share of
//! the workflow tasks and batches, plus what it keeps of its patch and outputs (at most
//! 16 KiB + 8 KiB + 8 KiB in a run of up to 300 forks; a larger run shares about 7.5 MiB
//! among its forks, [`history_caps`](super::history::history_caps)). A run of 1,300 forks (`MAX_INLINE_FORK_LIMIT`)
//! stays below Temporal's 10,240-event and 10 MiB history warnings.

use super::{
    failure::{StepFailure, failure_message},
    fork_result::{apply_ended, apply_failure, starting},
    history::{PATCH_MAX_BYTES, history_caps},
    input::{ForkInput, Handoff},
    join::join_all,
    options,
    patches::{Change, Patches},
    phase,
    prepare::{Prepared, WaveFork},
    settle::settle_durably,
    steps::{AgentRan, ForkSteps, agent_and_verify, finish_item},
};
use crate::{
    activities::{
        finish::{Finish, Finished},
        host::WaveLocal,
    },
    lifecycle::{charge::Settlement, finish::Ended, item::FinishItem},
};
use forkyard_common::clock::unix_ms;
use forkyard_proto::common::v1::ForkResult;
use temporalio_workflow::WorkflowContext;

/// Forks per finishing activity: its result (patches included) stays under 1 MB.
const CHUNK: usize = 32;

/// An inline fork whose agent (and verify) ended: to finish in the next batch.
pub(super) struct AgentDone {
    pub f: WaveFork,
    pub prepared: Prepared,
    pub input: ForkInput,
    pub ran: AgentRan,
}

impl AgentDone {
    /// The fork's phase while its batch finishes.
    pub(super) fn finishing_phase(&self) -> &'static str {
        if self.ran.agent.is_ok() {
            phase::PATCH
        } else {
            phase::CLEANUP
        }
    }
}

/// How a batch left a fork: done, or handed to a child with what the run had.
pub(super) enum Outcome {
    Done(u32, Box<ForkResult>),
    HandOff(Box<(WaveFork, Prepared, ForkInput)>),
}

/// The fork's input as its steps see it (the sandbox and reservation prepare made).
pub(super) fn input_for(f: &WaveFork, prepared: &Prepared) -> ForkInput {
    let mut input = f.input.clone();
    input.reservation_id.clone_from(&prepared.reservation_id);
    input.sandbox_ready_unix_ms = prepared.ready_unix_ms;
    input.sandbox = Some(prepared.sandbox.clone());
    input
}

/// The fork's agent and verify, in the run's history, cancelled by the fork's token;
/// `show` is told of its progress.
pub(super) async fn agent<W>(
    ctx: &WorkflowContext<W>,
    f: WaveFork,
    prepared: Prepared,
    show: impl Fn(&ForkResult),
) -> AgentDone {
    let fork = f.input.fork;
    let input = input_for(&f, &prepared);
    let result = starting(&input, &prepared.sandbox);
    show(&result);
    let steps = ForkSteps {
        input: &input,
        sandbox: &prepared.sandbox,
        key_owner: &f.child_id,
        cancel: f.cancel.clone(),
        activity_ids: Some(format!(
            "{}/a{}",
            forkyard_proto::ids::ForkId::segment(fork),
            input.attempt.max(1)
        )),
    };
    let ran = agent_and_verify(ctx, &steps, result, show).await;
    AgentDone {
        f,
        prepared,
        input,
        ran,
    }
}

fn item(d: &AgentDone) -> FinishItem {
    finish_item(&d.input, &d.prepared.sandbox, &d.f.child_id, &d.ran)
}

/// Finish a batch of forks (in the order given): patch, settle, destroy.
pub(super) async fn finish<W>(
    ctx: &WorkflowContext<W>,
    batch: Vec<AgentDone>,
    patches: Patches,
) -> Vec<Outcome> {
    let items: Vec<FinishItem> = batch.iter().map(item).collect();
    // Every fork of a batch is of the one run.
    let patch_max_bytes = batch
        .first()
        .map_or(PATCH_MAX_BYTES, |d| history_caps(&d.input.spec).patch);
    let runs = items.chunks(CHUNK).map(|forks| {
        let asked = forks.len();
        let forks = forks.to_vec();
        async move {
            let done = ctx
                .execute_activity(
                    WaveLocal::finish,
                    Finish {
                        forks,
                        patch_max_bytes,
                    },
                    options::finish(),
                )
                .await;
            match done {
                Ok(d) if d.forks.len() == asked => d.forks.into_iter().map(Ok).collect(),
                Ok(d) => {
                    let why = format!("finish forks: {} answers for {asked} forks", d.forks.len());
                    vec![Err(why); asked]
                }
                Err(e) => vec![Err(format!("finish forks: {e}")); asked],
            }
        }
    });
    let mut answers: Vec<Result<Finished, String>> =
        join_all(runs).await.into_iter().flatten().collect();
    settle_durably_where_the_ledger_was_away(ctx, patches, &items, &mut answers).await;
    let now = unix_ms(ctx.workflow_time());
    batch
        .into_iter()
        .zip(answers)
        .map(|(d, answer)| outcome(d, answer, now))
        .collect()
}

/// Settlements the finish step could not post because the ledger did not answer are
/// posted again durably (runs from this build on: the `durable-settle` patch), all at
/// once; each fork's answer then carries the ledger's reservation.
async fn settle_durably_where_the_ledger_was_away<W>(
    ctx: &WorkflowContext<W>,
    patches: Patches,
    items: &[FinishItem],
    answers: &mut [Result<Finished, String>],
) {
    let pending: Vec<usize> = answers
        .iter()
        .enumerate()
        .filter(|(_, a)| matches!(a, Ok(out) if out.reservation.is_none() && out.settle_retryable))
        .map(|(i, _)| i)
        .collect();
    if pending.is_empty() {
        return;
    }
    if !patches.takes(ctx, Change::DurableSettle) {
        return;
    }
    let runs = pending.iter().map(|&i| {
        let item = &items[i];
        let Ok(out) = &answers[i] else {
            unreachable!("only answered forks are pending")
        };
        let s = Settlement::made(item, out.committed, out.amount_micros);
        async move { settle_durably(ctx, &s).await }
    });
    let settled = join_all(runs).await;
    for (i, answer) in pending.into_iter().zip(settled) {
        if let Ok(out) = &mut answers[i] {
            match answer {
                Ok(r) => {
                    out.reservation = Some(r);
                    out.settle_error.clear();
                }
                Err(e) => out.settle_error = failure_message(e),
            }
        }
    }
}

fn outcome(d: AgentDone, answer: Result<Finished, String>, now: i64) -> Outcome {
    let AgentDone {
        f,
        prepared,
        mut input,
        ran: AgentRan {
            mut result,
            progress,
            agent,
        },
    } = d;
    let out = match answer {
        Ok(out) => out,
        Err(why) => {
            // Nothing is known of the steps: the janitor reaps the sandbox and releases
            // the reservation once the run has closed.
            apply_failure(&mut result, StepFailure::Failed(why));
            result.phase = phase::DONE.into();
            result.finished_unix_ms = now;
            return Outcome::Done(f.input.fork, Box::new(result));
        }
    };
    if out.handoff
        && let Ok(end) = agent
    {
        input.handoff = Some(Handoff {
            result,
            agent: end,
            cost_micros: progress.cost_micros,
            sandbox_charged_micros: progress.sandbox_charged_micros,
        });
        return Outcome::HandOff(Box::new((f, prepared, input)));
    }
    let ended = ended(out, agent.is_ok(), progress.cost_micros);
    let timeout_secs = input.spec.fork_timeout_secs;
    apply_ended(&mut result, agent, ended, timeout_secs, now);
    Outcome::Done(f.input.fork, Box::new(result))
}

/// How the finish activity's steps ended for one fork (`patched`: its patch was asked
/// for), as the child's own steps would say it.
fn ended(out: Finished, patched: bool, agent_cost_micros: i64) -> Ended<StepFailure> {
    let patch = match out.patch {
        Some(p) => Some(Ok(p)),
        None if patched => Some(Err(StepFailure::Failed(out.patch_error))),
        None => None,
    };
    let settlement = Settlement {
        commit: out.committed,
        // Results of a finish from before sandbox costs carry no amount: the agent's spend.
        amount_micros: if out.amount_micros > 0 {
            out.amount_micros
        } else {
            agent_cost_micros
        },
        ..Settlement::default()
    };
    let step = settlement.step();
    let settled = out
        .reservation
        .ok_or_else(|| StepFailure::Failed(format!("{step}: {}", out.settle_error)));
    let destroyed = if out.destroy_error.is_empty() {
        Ok(())
    } else {
        // The run closes after its forks: the janitor's sweep reaps the sandbox then.
        Err(StepFailure::Failed(out.destroy_error))
    };
    let snapshot = match (out.snapshot_id.is_empty(), out.snapshot_error.is_empty()) {
        (false, _) => Some(Ok(out.snapshot_id)),
        (true, false) => Some(Err(StepFailure::Failed(out.snapshot_error))),
        (true, true) => None,
    };
    Ended {
        patch,
        settlement,
        sandbox_cost_micros: out.sandbox_cost_micros,
        settled,
        destroyed,
        snapshot,
    }
}
