//! How a fork is finished, by one function whichever path runs it: collect its patch
//! (if its agent ran to its end), settle its reservation (commit what it spent, or
//! release it) and destroy its sandbox, in that order, each step retried by the one
//! table ([`super::tries`]).
//!
//! Two paths run it. An inline fork is finished inside the gateway's finish activity,
//! with a batch of others (`activities::finish`: the calls are gRPC, retried there); a
//! fork of a large run, or an inline fork whose patch is too large for the run's history,
//! by its `ForkWorkflow` child (`workflows::fork`: each step a local activity, retried
//! by Temporal). Each path says how its steps are made, and how a failure reads in its
//! fork's error, as a [`FinishSteps`]; what is done, in which order, what is charged and
//! when the destroy is brief is decided here, once. The child's steps are commands in its
//! history: this order is the order its recorded histories replay.

use super::{AtOwner, charge::Settlement, item::FinishItem};
use forkyard_proto::{budget::v1::Reservation, sandbox::v1::CollectPatchResponse};

/// How one path makes a fork's last steps, and what a step's failure is on it.
pub(crate) trait FinishSteps {
    type Failure;

    /// The fork's patch (`fork.sandbox`'s).
    async fn collect_patch(&self, fork: &FinishItem)
    -> Result<CollectPatchResponse, Self::Failure>;
    /// Whether this path hands the fork on instead of keeping `patch` (a patch larger
    /// than the run's history keeps): nothing is settled or destroyed then.
    fn hands_off(&self, patch: &CollectPatchResponse) -> bool;
    /// Whether a patch failure says the sandbox is gone (its destroy is then brief).
    fn names_lost(&self, failure: &Self::Failure) -> bool;
    async fn settle(&self, settlement: &Settlement) -> Result<Reservation, Self::Failure>;
    /// Snapshot the workspace (the fork's branch point); its id.
    async fn persist(&self, sandbox: &AtOwner) -> Result<String, Self::Failure>;
    /// Destroy the sandbox, briefly when it is known `lost`; one already gone counts as
    /// destroyed.
    async fn destroy(&self, sandbox: &AtOwner, lost: bool) -> Result<(), Self::Failure>;
}

/// How a fork's last steps ended.
#[derive(Debug)]
pub struct Ended<F> {
    /// `None`: not asked for (the agent did not run to its end).
    pub patch: Option<Result<CollectPatchResponse, F>>,
    pub settlement: Settlement,
    /// The sandbox's part of the settlement's amount (its whole cost, once its patch is in).
    pub sandbox_cost_micros: i64,
    pub settled: Result<Reservation, F>,
    pub destroyed: Result<(), F>,
    /// `None`: not asked for (see [`FinishItem::snapshot`]), or the sandbox is lost.
    pub snapshot: Option<Result<String, F>>,
}

/// Finish one fork: patch, settle, destroy. `None`: handed off after its patch (see
/// [`FinishSteps::hands_off`]). Never fails as a whole: each step's outcome is kept.
pub(crate) async fn finish_fork<S: FinishSteps>(
    steps: &S,
    fork: &FinishItem,
) -> Option<Ended<S::Failure>> {
    let patch = if fork.collect_patch {
        Some(steps.collect_patch(fork).await)
    } else {
        None
    };
    let patched = match &patch {
        Some(Ok(p)) if steps.hands_off(p) => return None,
        Some(Ok(p)) => Some(p.usage.map(|u| u.cost_micros)),
        _ => None,
    };
    let (settlement, sandbox_cost_micros) =
        Settlement::of(fork, patched.flatten(), patched.is_some());
    let lost = fork.sandbox_lost || matches!(&patch, Some(Err(f)) if steps.names_lost(f));
    // Before the settlement: a branch point is part of what the fork left, and after
    // the patch, which it must not change (the patch is what a branch starts from).
    let snapshot = if fork.snapshot && !lost && !fork.sandbox.sandbox_id.is_empty() {
        Some(steps.persist(&fork.sandbox).await)
    } else {
        None
    };
    let settled = steps.settle(&settlement).await;
    let destroyed = if fork.sandbox.sandbox_id.is_empty() {
        Ok(())
    } else {
        steps.destroy(&fork.sandbox, lost).await
    };
    Some(Ended {
        patch,
        settlement,
        sandbox_cost_micros,
        settled,
        destroyed,
        snapshot,
    })
}
