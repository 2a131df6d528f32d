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
//! Each fork is finished by the one function that also finishes a child workflow's fork
//! (`crate::lifecycle::finish::finish_fork`); here its steps are gRPC calls, retried by
//! the one table (`crate::lifecycle::tries`) that the child's local activities take as
//! their retry policies. The activity never fails as a whole; a fork's outcome says which
//! step stopped it.
//! Settle and destroy carry idempotency keys or are idempotent, so an activity that runs
//! again after a gateway crash applies nothing twice.
//!
//! A patch larger than the batch's `patch_max_bytes` is not kept: that fork stops after
//! its patch (`handoff`) and the run hands it to a child workflow, which collects the
//! whole patch into a history of its own, then settles and destroys.

use super::{
    ledger,
    retry::retried,
    sandboxes::{self, SandboxLocal},
};
use crate::lifecycle::{
    AtOwner, SANDBOX_LOST,
    charge::Settlement,
    finish::{Ended, FinishSteps, finish_fork},
    item::FinishItem,
    tries,
};
use forkyard_common::telemetry::otel::{
    KeyValue,
    trace::{FutureExt as _, Status as SpanStatus, TraceContextExt as _},
};
use forkyard_proto::{
    budget::v1::Reservation,
    sandbox::v1::{CollectPatchRequest, CollectPatchResponse, PersistWorkspaceRequest},
};
use serde::{Deserialize, Serialize};
use std::{
    collections::BTreeMap,
    sync::{Mutex, MutexGuard, PoisonError},
};
use temporalio_sdk::activities::ActivityContext;
use tonic::Status;

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Finish {
    pub forks: Vec<FinishItem>,
    /// The largest patch a fork keeps here; a larger one is a handoff.
    pub patch_max_bytes: u64,
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
    /// The workspace's snapshot at the fork's end (a run open for branches).
    pub snapshot_id: String,
    pub snapshot_error: String,
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
        let cx = super::fork_span::span(
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
            let out = self.finish(&item).with_context(cx.clone()).await;
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

impl Batch<'_> {
    /// One fork, finished by the one rule ([`finish_fork`]) with this batch's calls.
    async fn finish(&self, item: &FinishItem) -> Finished {
        match finish_fork(self, item).await {
            Some(ended) => Finished::from(ended),
            None => Finished {
                handoff: true,
                ..Finished::default()
            },
        }
    }
}

/// A step's failure here: its message, and (a settlement) whether the ledger may take
/// it later.
pub(crate) struct StepError {
    message: String,
    retryable: bool,
}

impl From<String> for StepError {
    fn from(message: String) -> Self {
        Self {
            message,
            retryable: false,
        }
    }
}

impl From<Ended<StepError>> for Finished {
    fn from(ended: Ended<StepError>) -> Self {
        let (patch, patch_error) = match ended.patch {
            Some(Ok(p)) => (Some(p), String::new()),
            Some(Err(e)) => (None, e.message),
            None => (None, String::new()),
        };
        let (reservation, settle_error, settle_retryable) = match ended.settled {
            Ok(r) => (Some(r), String::new(), false),
            Err(e) => (None, e.message, e.retryable),
        };
        let (snapshot_id, snapshot_error) = match ended.snapshot {
            Some(Ok(id)) => (id, String::new()),
            Some(Err(e)) => (String::new(), e.message),
            None => (String::new(), String::new()),
        };
        Self {
            snapshot_id,
            snapshot_error,
            patch,
            patch_error,
            handoff: false,
            committed: ended.settlement.commit,
            reservation,
            settle_error,
            settle_retryable,
            destroy_error: ended.destroyed.err().map(|e| e.message).unwrap_or_default(),
            sandbox_cost_micros: ended.sandbox_cost_micros,
            amount_micros: ended.settlement.amount_micros,
        }
    }
}

fn sandbox_final(s: &Status) -> bool {
    !sandboxes::error_type(s).1
}

fn ledger_final(s: &Status) -> bool {
    !ledger::error_type(s).1
}

/// The batch's steps are its own gRPC calls, each retried by the one table.
impl FinishSteps for Batch<'_> {
    type Failure = StepError;

    async fn collect_patch(&self, fork: &FinishItem) -> Result<CollectPatchResponse, StepError> {
        let owner = self.sandboxes.owner_of(&fork.sandbox.endpoint)?;
        let req = CollectPatchRequest {
            sandbox_id: fork.sandbox.sandbox_id.clone(),
            max_bytes: self.patch_max_bytes,
            idempotency_key: patch_key(fork),
        };
        retried(tries::PATCH, sandbox_final, || {
            let (mut c, req) = (owner.clone(), req.clone());
            async move { c.collect_patch(req).await }
        })
        .await
        .map(tonic::Response::into_inner)
        .map_err(|s| sandboxes::patch_failure_message(&s).into())
    }

    /// A patch larger than the batch keeps goes to a child workflow.
    fn hands_off(&self, patch: &CollectPatchResponse) -> bool {
        patch.truncated
    }

    fn names_lost(&self, failure: &StepError) -> bool {
        failure.message.contains(SANDBOX_LOST)
    }

    async fn settle(&self, s: &Settlement) -> Result<Reservation, StepError> {
        forkyard_common::fault::point("finish.after-patch");
        let settled = if s.commit {
            retried(tries::LEDGER, ledger_final, || {
                let (mut c, req) = (self.ledger.clone(), s.commit_request());
                async move { c.commit(req).await }
            })
            .await
        } else {
            retried(tries::LEDGER, ledger_final, || {
                let (mut c, req) = (self.ledger.clone(), s.release_request());
                async move { c.release(req).await }
            })
            .await
        };
        forkyard_common::fault::point("finish.after-commit");
        settled
            .map(tonic::Response::into_inner)
            .map_err(|s| StepError {
                message: ledger::message(&s),
                retryable: !ledger_final(&s),
            })
    }

    async fn persist(&self, sandbox: &AtOwner) -> Result<String, StepError> {
        let owner = self.sandboxes.owner_of(&sandbox.endpoint)?;
        let req = PersistWorkspaceRequest {
            sandbox_id: sandbox.sandbox_id.clone(),
        };
        retried(tries::PATCH, sandbox_final, || {
            let (mut c, req) = (owner.clone(), req.clone());
            async move { c.persist_workspace(req).await }
        })
        .await
        .map(|r| r.into_inner().snapshot_id)
        .map_err(|s| StepError::from(format!("snapshot workspace: {}", s.message())))
    }

    /// Tried until the cleanup deadline, not three times: a provisioner away for a
    /// minute (a restart, an outage) must not leave the sandbox to the janitor. But a
    /// sandbox already lost (the fork starts again elsewhere) is tried briefly: the run
    /// must not wait minutes for a replica that is gone.
    async fn destroy(&self, sandbox: &AtOwner, lost: bool) -> Result<(), StepError> {
        let destroyed = match self.sandboxes.owner_of(&sandbox.endpoint) {
            Ok(owner) => {
                let tries = if lost {
                    tries::DESTROY_LOST
                } else {
                    tries::DESTROY
                };
                let final_error = |s: &Status| tries.never.contains(&sandboxes::error_type(s).0);
                let destroy = || sandboxes::destroy_with(owner.clone(), sandbox.clone());
                retried(tries, final_error, destroy).await.map_err(|s| {
                    format!(
                        "destroy sandbox: {} (tried for {} s; left to the janitor's sweep)",
                        s.message(),
                        tries.span().as_secs()
                    )
                })
            }
            Err(e) => Err(e),
        };
        forkyard_common::fault::point("finish.after-destroy");
        destroyed.map(drop).map_err(StepError::from)
    }
}
