//! Where each fork of a wave is between rounds, and where a round's outcome sends it.

use super::{Prepared, WaveFork, WavePlan};
use crate::{
    activities::wave::ForkPrepared,
    workflows::failure::{StepFailure, refused},
};
use forkyard_proto::sandbox::v1::Sandbox;

/// Where one fork of a wave is while it is prepared.
pub(super) enum Step {
    /// Still to prepare (again), with the reservation an earlier round made; `on`: the
    /// backend its create was moved to after its own refused it (a run over several).
    Todo {
        reservation_id: String,
        on: Option<String>,
    },
    Ready(Prepared),
    /// Stopped; what it holds is given back in the wave's cleanup stages.
    Failed {
        reservation_id: Option<String>,
        sandbox: Option<Sandbox>,
        why: StepFailure,
    },
}

/// A fork's step after a round's `outcome`: ready, failed, or to try again (not in the
/// `last` round, unless a draining replica refused it and the run `waits` out drains).
pub(super) fn advance(
    f: &WaveFork,
    step: &mut Step,
    outcome: Result<ForkPrepared, StepFailure>,
    last: bool,
    waits: bool,
    plan: WavePlan,
) {
    let Step::Todo { reservation_id, on } = step else {
        return;
    };
    let holds = held(std::mem::take(reservation_id));
    // Tried again where it was moved to (runs of earlier builds went back to the
    // fork's own backend, which had refused it).
    let moved_to = on.take().filter(|_| plan.waits_for_room);
    *step = match outcome {
        Err(why) => Step::Failed {
            reservation_id: holds,
            sandbox: None,
            why,
        },
        Ok(p) => {
            let draining = p.error_type == forkyard_proto::activities::errors::SANDBOX_DRAINING;
            match next_step(f, p, last && !(waits && draining)) {
                Step::Todo { reservation_id, .. } => Step::Todo {
                    reservation_id,
                    on: moved_to,
                },
                other => other,
            }
        }
    };
}

/// A reservation id as a fork holds it: empty is none.
pub(super) fn held(reservation_id: String) -> Option<String> {
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
            on: None,
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

fn cancelled_or_failed(f: &WaveFork) -> StepFailure {
    if f.cancel.is_cancelled() {
        StepFailure::Cancelled
    } else {
        StepFailure::Failed("fork preparation stopped".into())
    }
}
