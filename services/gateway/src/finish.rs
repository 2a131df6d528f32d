//! The last steps of a batch of a run's inline forks as one activity, run by the
//! gateway's worker on its own queue: for every fork whose agent (and verify) ended,
//! collect its patch, settle its reservation (budget-ledger) and destroy its sandbox
//! (sandbox-provisioner), all forks at once and each fork on to its next step as soon as
//! its own call answers.
//!
//! Why one activity for a batch: three local activities a fork were three markers in the
//! run's history and, in a run that interleaves them with other forks' events, an order
//! of local-activity results that a replay does not reproduce (see `workflows::prepare`).
//! Why not a local activity: see `workflows::options::finish`.
//!
//! Each step keeps the retry table of the child workflow's own local activities: patch
//! 3×/2 s/×2, ledger 5×/1 s/×2, destroy 3×/2 s/×2, retrying only what may succeed later.
//! The activity never fails as a whole; a fork's outcome says which step stopped it.
//! Settle and destroy carry idempotency keys or are idempotent, so an activity that runs
//! again after a gateway crash applies nothing twice.
//!
//! A patch larger than the batch's `patch_max_bytes` is not kept: that fork stops after
//! its patch (`handoff`) and the run hands it to a child workflow, which collects the
//! whole patch into a history of its own, then settles and destroys.

use crate::{
    ledger,
    retry::{retried, retried_within},
    sandboxes::{self, AtOwner, SandboxLocal},
};
use forkyard_common::telemetry::otel::{
    KeyValue,
    trace::{FutureExt as _, Status as SpanStatus, TraceContextExt as _},
};
use forkyard_proto::{
    budget::v1::{CommitRequest, ReleaseRequest, Reservation},
    sandbox::v1::{CollectPatchRequest, CollectPatchResponse},
};
use serde::{Deserialize, Serialize};
use std::{
    collections::BTreeMap,
    sync::{Mutex, MutexGuard, PoisonError},
    time::Duration,
};
use temporalio_sdk::activities::ActivityContext;
use tonic::{Code, Status};

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Finish {
    pub forks: Vec<FinishItem>,
    /// The largest patch a fork keeps here; a larger one is a handoff.
    pub patch_max_bytes: u64,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct FinishItem {
    /// For the fork's span.
    pub run_id: String,
    pub fork: u32,
    pub sandbox: AtOwner,
    /// Collect the patch first (the agent ran, successfully or not).
    pub collect_patch: bool,
    /// The fork succeeds if its patch is collected: it commits even what costs nothing.
    pub succeeds_with_patch: bool,
    pub reservation_id: String,
    pub cost_micros: i64,
    /// Of `cost_micros`, the sandbox time the agent charged as it ran.
    pub sandbox_charged_micros: i64,
    pub commit_key: String,
    pub release_key: String,
    /// The agent lost the sandbox (its replica went away): its destroy is tried briefly,
    /// since the fork starts again elsewhere and must not wait for a replica that is gone.
    pub sandbox_lost: bool,
}

/// One fork's outcome; a step's error is empty when it went well (or did not run).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Finished {
    pub patch: Option<CollectPatchResponse>,
    pub patch_error: String,
    /// The patch is larger than the batch keeps: nothing was settled or destroyed.
    pub handoff: bool,
    /// Committed (true) or released.
    pub committed: bool,
    pub reservation: Option<Reservation>,
    pub settle_error: String,
    /// The settlement failed only because the ledger did not answer (down, slow): the
    /// workflow posts it again durably (`workflows::settle::settle_durably`).
    pub settle_retryable: bool,
    pub destroy_error: String,
    /// The sandbox's part of what was committed (its whole cost, once its patch is in).
    pub sandbox_cost_micros: i64,
    /// The commit's amount (the agent's spend with the sandbox's whole cost).
    pub amount_micros: i64,
}

/// A finish attempt's heartbeat: the forks it finished, by their place in the batch
/// (patches of inline forks are small, `workflows::history::PATCH_MAX_BYTES`).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct FinishProgress {
    pub done: BTreeMap<usize, Finished>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct FinishDone {
    pub forks: Vec<Finished>,
}

/// A finish batch under way: what each of its forks uses, and the forks finished so
/// far by their place in the batch (the heartbeat's details).
pub(crate) struct Batch<'a> {
    pub ledger: &'a ledger::Client,
    pub sandboxes: &'a SandboxLocal,
    pub patch_max_bytes: u64,
    pub done: Mutex<BTreeMap<usize, Finished>>,
}

impl Batch<'_> {
    fn done(&self) -> MutexGuard<'_, BTreeMap<usize, Finished>> {
        self.done.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The heartbeat's details: the forks finished so far.
    pub(crate) fn progress(&self) -> FinishProgress {
        FinishProgress {
            done: self.done().clone(),
        }
    }

    /// Every fork of the batch at once, each on to its next step as its own call answers.
    pub(crate) async fn all(&self, forks: Vec<FinishItem>) -> Vec<Finished> {
        futures::future::join_all(forks.into_iter().enumerate().map(|(i, f)| self.fork(i, f))).await
    }

    /// The `i`th fork of the batch, under a span of its own: what an earlier attempt
    /// reached for it, or finished now and kept for the heartbeat.
    pub(crate) fn fork(&self, i: usize, item: FinishItem) -> impl Future<Output = Finished> {
        let earlier = self.done().get(&i).cloned();
        let cx = crate::fork_span::span(
            "FinishFork",
            Some(item.run_id.clone()),
            Some(i64::from(item.fork)),
        );
        cx.span().set_attribute(KeyValue::new(
            "forkyard.sandbox_id",
            item.sandbox.sandbox_id.clone(),
        ));
        let (run_id, fork) = (item.run_id.clone(), item.fork);
        async move {
            if let Some(out) = earlier {
                tracing::info!(run_id, fork, "fork finished by an earlier attempt");
                cx.span().end();
                return out;
            }
            let out = finish_fork(self.ledger, self.sandboxes, item, self.patch_max_bytes)
                .with_context(cx.clone())
                .await;
            self.done().insert(i, out.clone());
            let span = cx.span();
            for error in [&out.patch_error, &out.settle_error, &out.destroy_error] {
                if !error.is_empty() {
                    tracing::warn!(run_id, fork, error, "fork finish step failed");
                    span.set_status(SpanStatus::error(error.clone()));
                }
            }
            span.end();
            out
        }
    }
}

impl crate::wave::WaveLocal {
    /// A finish batch that goes on from `earlier`, what an earlier attempt reached (its
    /// last heartbeat's details).
    pub(crate) fn finishing(&self, earlier: FinishProgress, patch_max_bytes: u64) -> Batch<'_> {
        Batch {
            ledger: &self.ledger,
            sandboxes: &self.sandboxes,
            patch_max_bytes,
            done: Mutex::new(earlier.done),
        }
    }

    /// The finish activity's work without its heartbeat: the batch's forks, those
    /// `earlier` holds as an earlier attempt left them, the others finished now.
    pub async fn finish_after(&self, earlier: FinishProgress, batch: Finish) -> FinishDone {
        let finishing = self.finishing(earlier, batch.patch_max_bytes);
        FinishDone {
            forks: finishing.all(batch.forks).await,
        }
    }
}

/// What an earlier attempt of this finish reached, from its last heartbeat.
pub(crate) fn earlier(ctx: &ActivityContext) -> FinishProgress {
    if ctx.info().attempt > 1 {
        ctx.heartbeat_details()
            .deserialize::<FinishProgress>()
            .unwrap_or_else(|e| {
                tracing::warn!(error = %e, "unreadable finish heartbeat; finishing every fork again");
                None
            })
            .unwrap_or_default()
    } else {
        FinishProgress::default()
    }
}

fn sandbox_final(s: &Status) -> bool {
    !sandboxes::error_type(s).1
}

fn ledger_final(s: &Status) -> bool {
    !ledger::error_type(s).1
}

/// Collect one fork's patch, settle its reservation and destroy its sandbox, each step
/// retried as the child workflow's local activities are; never fails as a whole.
pub(crate) async fn finish_fork(
    ledger: &ledger::Client,
    sandboxes: &SandboxLocal,
    item: FinishItem,
    patch_max_bytes: u64,
) -> Finished {
    let mut out = Finished::default();
    let owner = match sandboxes.owner_of(&item.sandbox.endpoint) {
        Ok(c) => Some(c),
        Err(e) => {
            out.destroy_error = e.clone();
            if item.collect_patch {
                out.patch_error = e;
            }
            None
        }
    };
    if item.collect_patch
        && let Some(owner) = &owner
    {
        let key = patch_key(&item);
        match collect_patch(owner, &item.sandbox.sandbox_id, patch_max_bytes, key).await {
            Ok(p) => {
                if p.truncated {
                    out.handoff = true;
                    return out;
                }
                out.patch = Some(p);
            }
            Err(s) => out.patch_error = sandboxes::patch_failure_message(&s),
        }
    }
    forkyard_common::fault::point("finish.after-patch");
    settle(ledger, &item, &mut out).await;
    forkyard_common::fault::point("finish.after-commit");
    if let Some(owner) = owner {
        // Tried until the cleanup deadline, not three times: a provisioner away for a
        // minute (a restart, an outage) must not leave the sandbox to the janitor. But a
        // sandbox already lost (the fork starts again elsewhere) is tried briefly: the
        // run must not wait minutes for a replica that is gone.
        let lost = item.sandbox_lost || out.patch_error.contains(crate::workflows::SANDBOX_LOST);
        let final_error = |s: &Status| s.code() == Code::InvalidArgument;
        let destroy = || sandboxes::destroy_with(owner.clone(), item.sandbox.clone());
        let destroyed = if lost {
            retried(3, Duration::from_secs(2), final_error, destroy).await
        } else {
            retried_within(
                CLEANUP_DEADLINE,
                Duration::from_secs(2),
                Duration::from_secs(30),
                final_error,
                destroy,
            )
            .await
        };
        if let Err(s) = destroyed {
            let tried = if lost { 6 } else { CLEANUP_DEADLINE.as_secs() };
            out.destroy_error = format!(
                "destroy sandbox: {} (tried for {tried} s; left to the janitor's sweep)",
                s.message()
            );
        }
    }
    forkyard_common::fault::point("finish.after-destroy");
    out
}

/// How long a fork's sandbox destroy is tried (its owner replica down or restarting)
/// before the sandbox is left to the janitor: within the finish activity's
/// start-to-close (`workflows::options::finish`, 720 s), which heartbeats meanwhile.
pub(crate) const CLEANUP_DEADLINE: Duration = Duration::from_secs(300);

/// The patch's idempotency key, the fork attempt's as its commit's
/// (`<run>/fork-<n>/a<attempt>/commit` → `…/patch`): a retry of the finish gets the
/// first attempt's patch back, byte for byte, also from a sandbox destroyed since, so
/// it settles the same amount (`sandbox_provisioner::patch_records`).
fn patch_key(item: &FinishItem) -> String {
    match item.commit_key.strip_suffix("/commit") {
        Some(attempt) => format!("{attempt}/patch"),
        None if item.commit_key.is_empty() => String::new(),
        None => format!("{}/patch", item.commit_key),
    }
}

/// The fork's patch, at most `max_bytes` of it (a larger one comes back truncated).
async fn collect_patch(
    owner: &sandboxes::Client,
    sandbox_id: &str,
    max_bytes: u64,
    idempotency_key: String,
) -> Result<CollectPatchResponse, Status> {
    let req = CollectPatchRequest {
        sandbox_id: sandbox_id.to_owned(),
        max_bytes,
        idempotency_key,
    };
    retried(3, Duration::from_secs(2), sandbox_final, || {
        let (mut c, req) = (owner.clone(), req.clone());
        async move { c.collect_patch(req).await }
    })
    .await
    .map(tonic::Response::into_inner)
}

/// Commit what the fork spent (with its sandbox's cost, once its patch is in), or
/// release its reservation when it spent nothing and does not succeed.
async fn settle(ledger: &ledger::Client, item: &FinishItem, out: &mut Finished) {
    let patched = !item.collect_patch || out.patch.is_some();
    let (amount, sandbox) = crate::workflows::commit_amount(
        item.cost_micros,
        item.sandbox_charged_micros,
        out.patch
            .as_ref()
            .and_then(|p| p.usage)
            .map(|u| u.cost_micros),
    );
    (out.amount_micros, out.sandbox_cost_micros) = (amount, sandbox);
    out.committed = amount > 0 || (item.succeeds_with_patch && patched);
    let settled = if out.committed {
        let req = CommitRequest {
            reservation_id: item.reservation_id.clone(),
            amount_micros: amount,
            idempotency_key: item.commit_key.clone(),
        };
        retried(5, Duration::from_secs(1), ledger_final, || {
            let (mut c, req) = (ledger.clone(), req.clone());
            async move { c.commit(req).await }
        })
        .await
    } else {
        let req = ReleaseRequest {
            reservation_id: item.reservation_id.clone(),
            idempotency_key: item.release_key.clone(),
        };
        retried(5, Duration::from_secs(1), ledger_final, || {
            let (mut c, req) = (ledger.clone(), req.clone());
            async move { c.release(req).await }
        })
        .await
    };
    match settled {
        Ok(r) => out.reservation = Some(r.into_inner()),
        Err(s) => {
            out.settle_retryable = !ledger_final(&s);
            out.settle_error = ledger::message(&s);
        }
    }
}
