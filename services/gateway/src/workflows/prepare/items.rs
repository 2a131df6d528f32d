//! What a round of a wave's preparation asks for each fork: its reserve and its create,
//! on the run's backend or the one the fork was moved to (a run over several backends).

use super::{OpensAccount, Step, WaveFork, WavePlan, held};
use crate::{
    activities::wave::{ForkPrepared, WaveItem},
    workflows::{failure::StepFailure, input::step_key},
};
use forkyard_proto::{budget::v1::ReserveRequest, labels, sandbox::v1::CreateSandboxRequest};
use std::collections::HashMap;
use temporalio_workflow::WorkflowContext;

/// The forks a round prepares (their indexes in the wave, and what to ask for each);
/// a fork cancelled meanwhile stops here.
pub(super) fn round_items(
    wave: &[WaveFork],
    steps: &mut [Step],
    backend_per_run: bool,
) -> (Vec<usize>, Vec<WaveItem>) {
    let key = |f: &WaveFork, step: &str| step_key(&f.child_id, f.input.attempt, step);
    let mut todo = Vec::new();
    let mut items = Vec::new();
    for (i, (f, step)) in wave.iter().zip(steps.iter_mut()).enumerate() {
        let Step::Todo { reservation_id, on } = step else {
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
        todo.push(i);
        items.push(WaveItem {
            reservation_id: reservation_id.clone(),
            reserve: ReserveRequest {
                account_id: f.input.run_id.clone(),
                amount_micros: f.input.reservation_micros,
                holder: f.owner().to_owned(),
                idempotency_key: key(f, "reserve"),
            },
            create: match on {
                // Its own key on each backend it is moved to: a key names one create.
                Some(b) => create_request(f, key(f, &format!("create-on-{b}")), true, Some(b)),
                None => create_request(f, key(f, "create"), backend_per_run, None),
            },
            // A branch is created at the provisioner replica holding its parent's snapshot.
            create_at: f
                .input
                .branch
                .as_ref()
                .map(|b| b.snapshot_endpoint.clone())
                .unwrap_or_default(),
        });
    }
    (todo, items)
}

fn create_request(
    f: &WaveFork,
    idempotency_key: String,
    backend_per_run: bool,
    moved_to: Option<&str>,
) -> CreateSandboxRequest {
    let spec = &f.input.spec;
    // The run's backend, resolved at launch (the operator's default filled in), or the
    // one this fork was placed on (a run over several: `spec` is the fork's own copy);
    // runs of earlier builds, and any spec without one, on local as they always were.
    let backend = moved_to
        .or(Some(spec.backend.as_str()).filter(|b| backend_per_run && !b.is_empty()))
        .unwrap_or("local");
    CreateSandboxRequest {
        backend: backend.to_owned(),
        repo: spec.repo.clone(),
        base_ref: spec.base_ref.clone(),
        branch: forkyard_proto::ids::fork_branch(&spec.branch, f.input.fork),
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
        // Whose git credentials the provisioner clones with (the run's tenant's own,
        // else the shared ones; FORKYARD_GIT_CREDENTIALS).
        tenant: spec.tenant.clone(),
        // gVisor or bubblewrap: the provisioner refuses (FAILED_PRECONDITION) what it
        // cannot give, never substituting.
        isolation: spec.isolation.clone(),
        // A branch starts from its parent's workspace at its end: no clone.
        snapshot_id: f
            .input
            .branch
            .as_ref()
            .map(|b| b.snapshot_id.clone())
            .unwrap_or_default(),
        ..Default::default()
    }
}

/// A fork whose create its backend refused, in a run over several backends: moved to
/// the next backend with room, to be created there in the next round (not in the last
/// round); or, when none has room (or in the last round), waiting for room on those
/// after it (`plan.waits_for_room`), its step stopped so that what it holds is given
/// back. `true` either way; otherwise (`false`) its outcome is for [`super::advance`].
pub(super) fn moved_on<W: OpensAccount>(
    ctx: &WorkflowContext<W>,
    plan: WavePlan,
    f: &WaveFork,
    step: &mut Step,
    outcome: &Result<ForkPrepared, StepFailure>,
    last: bool,
) -> bool {
    let Ok(p) = outcome else { return false };
    let Step::Todo { on, .. } = step else {
        return false;
    };
    if !plan.fails_over || !p.backend_refused || p.sandbox.is_some() || f.cancel.is_cancelled() {
        return false;
    }
    let from = on.clone().unwrap_or_else(|| f.input.spec.backend.clone());
    let fork = f.input.fork;
    if !last && let Some(next) = ctx.state_mut(|s| s.move_fork(fork, &from)) {
        *step = Step::Todo {
            reservation_id: p.reservation_id.clone(),
            on: Some(next),
        };
        return true;
    }
    if !plan.waits_for_room {
        return false;
    }
    let Some(later) = ctx.state_mut(|s| s.wait_for_room(fork, &from)) else {
        return false;
    };
    *step = Step::Failed {
        reservation_id: held(p.reservation_id.clone()),
        sandbox: None,
        why: StepFailure::WaitsForRoom(format!(
            "{from} refused its create ({}); waiting for room on {later}",
            p.error
        )),
    };
    true
}
