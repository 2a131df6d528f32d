//! A wave's preparation as one local activity of the gateway's worker: for every fork
//! of the wave, reserve its budget (budget-ledger), create its sandbox and health-check
//! it (sandbox-provisioner), all forks at once and each fork on to its next step as soon
//! as its own calls answer.
//!
//! A fork's reserve and create are sent together (a sandbox made for a fork whose
//! reserve is refused is destroyed before anything runs in it); its health check follows
//! its create.
//!
//! Why one activity: as a local activity per fork and step, a 100-fork wave was 201
//! markers in the run's history and three stages in lockstep (every fork waited for the
//! slowest reserve, then the slowest create; see `workflows::prepare` on why lockstep).
//! As one it is one marker, and a fork's way to a ready sandbox is its own three calls.
//!
//! What comes back is each fork's outcome, never the whole activity's failure: what a
//! fork holds (its reservation, its sandbox) is in its outcome whichever step stopped it,
//! so the workflow gives it back. A step that may succeed later (the ledger or the
//! provisioner unreachable) is marked `retryable`; the workflow tries those forks again
//! in a later round (the seed's create policy, 3×/5 s/×2) under the same idempotency
//! keys, passing on the reservation a fork already holds.
//!
//! Tracing: each fork's calls hang under a `PrepareFork` span of its own (run id, fork,
//! sandbox id), under the activity's span in the run's trace.

use super::{
    ledger,
    retry::retried,
    sandboxes::{self, SandboxLocal},
};
use crate::lifecycle::{AtOwner, tries};
use forkyard_common::telemetry::otel::{
    Context, KeyValue,
    trace::{FutureExt as _, Status as SpanStatus, TraceContextExt as _},
};
use forkyard_proto::{
    activities::errors,
    budget::v1::{CreateAccountRequest, OpenAccountRequest, Reservation, ReserveRequest},
    labels,
    sandbox::v1::{CreateSandboxRequest, HealthCheckRequest, Sandbox},
};
use serde::{Deserialize, Serialize};
use std::time::SystemTime;

/// A wave's calls: the ledger's and the provisioners' clients.
pub(crate) struct Preparer<'a> {
    pub ledger: &'a ledger::Client,
    pub sandboxes: &'a SandboxLocal,
}

/// The forks of a wave still to prepare.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Wave {
    pub forks: Vec<WaveItem>,
    /// The run's ledger account, when this wave opens it (the run's first): opened
    /// while the forks' sandboxes are made, each fork's reserve after it.
    pub open: Option<AccountOpen>,
}

/// How a run's account is opened: on its own, or under its tenant's account.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum AccountOpen {
    Open(OpenAccountRequest),
    Create(CreateAccountRequest),
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct WaveItem {
    /// The reservation an earlier round made; empty: reserve with `reserve` first.
    pub reservation_id: String,
    pub reserve: ReserveRequest,
    pub create: CreateSandboxRequest,
    /// The replica to create at (a branch: where its parent's snapshot is); empty: any.
    pub create_at: String,
}

/// Each fork's outcome, in the wave's order.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct WaveDone {
    pub forks: Vec<ForkPrepared>,
    /// Why the run's account could not be opened (the wave's `open`), after the
    /// ledger calls' own retries; its forks then stopped at [`step::OPEN`], their
    /// sandboxes destroyed (or left in their outcome to destroy).
    pub open_error: String,
}

/// How far one fork got. Ready when `step` is empty; otherwise `step` names the step that
/// stopped it, and what it made before that is still here to give back.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct ForkPrepared {
    pub reservation_id: String,
    pub sandbox: Option<Sandbox>,
    /// When the health check answered healthy (the fork's `sandbox_ready_unix_ms`; the
    /// workflow's time would be the start of its task).
    pub ready_unix_ms: i64,
    pub step: String,
    /// As on the activity failure the single step would have raised (e.g.
    /// `BudgetExceeded`, `SandboxUnavailable`); empty for an unhealthy sandbox.
    pub error_type: String,
    pub error: String,
    /// Worth trying again (under the same idempotency keys).
    pub retryable: bool,
    /// The create was refused by its backend itself (`sandboxes::backend_refused`): a
    /// run over several backends sends the fork to the next one.
    pub backend_refused: bool,
}

/// Step names, as they appear in a fork's error (`"create sandbox: …"`).
pub mod step {
    pub const OPEN: &str = "open ledger account";
    pub const RESERVE: &str = "reserve budget";
    pub const CREATE: &str = "create sandbox";
    pub const HEALTH: &str = "health check";
}

impl ForkPrepared {
    fn stop(mut self, step: &str, error_type: &str, error: String, retryable: bool) -> Self {
        step.clone_into(&mut self.step);
        error_type.clone_into(&mut self.error_type);
        self.error = error;
        self.retryable = retryable;
        self
    }
}

impl Preparer<'_> {
    /// The fork's reserve and create go out together, its health check right after its
    /// create. A reserve is refused only when the run's budget is spent (or the ledger
    /// is away), and waiting for the ledger's commit before the create put a whole
    /// ledger round trip (one fsync per group; docs/performance.md) in front of every
    /// sandbox; so did waiting for it before the health check, once creates were fast
    /// (a wave's hundred reserves answer together, after the account's open). A sandbox
    /// made for a fork the ledger refused is destroyed here before anything runs in it.
    async fn prepare_fork(&self, item: WaveItem, opened: Opened) -> ForkPrepared {
        let mut out = ForkPrepared {
            reservation_id: item.reservation_id,
            ..ForkPrepared::default()
        };
        let reserve = self.reserve(out.reservation_id.is_empty(), item.reserve, opened);
        let made = async {
            let mut creates = if item.create_at.is_empty() {
                self.sandboxes.creates()
            } else {
                self.sandboxes
                    .owner_of(&item.create_at)
                    .map_err(tonic::Status::invalid_argument)?
            };
            let sandbox = creates.create_sandbox(item.create).await?.into_inner();
            // A test's kill with a wave's creates under way (debug builds).
            forkyard_common::fault::point("wave.after-create");
            let health = self.health_check(&sandbox).await;
            Ok::<_, tonic::Status>((sandbox, health))
        };
        let (reserved, made) = futures::join!(reserve, made);
        match reserved {
            Some(Err(refusal)) => {
                return self.refused(out, refusal, made.map(|(s, _)| s)).await;
            }
            Some(Ok(r)) => out.reservation_id = r.reservation_id,
            None => {}
        }
        let (sandbox, health) = match made {
            Ok(made) => made,
            Err(status) => {
                let (ty, retryable) = sandboxes::error_type(&status);
                let msg = status.message().to_owned();
                out.backend_refused = sandboxes::backend_refused(&status);
                return out.stop(step::CREATE, ty, msg, retryable);
            }
        };
        out.sandbox = Some(sandbox);
        match health {
            Health::Ready(at) => {
                out.ready_unix_ms = at;
                out
            }
            // Health is tried once (the seed's table).
            Health::Not { error_type, detail } => out.stop(step::HEALTH, error_type, detail, false),
        }
    }

    /// The fork's reserve, unless it holds a reservation from an earlier round.
    async fn reserve(
        &self,
        unreserved: bool,
        req: ReserveRequest,
        opened: Opened,
    ) -> Option<Result<Reservation, Refusal>> {
        // The reserve needs the run's account: when this wave opens it, after that.
        if let Err(msg) = opened.await {
            return Some(Err(Refusal::Open(msg)));
        }
        if unreserved {
            Some(
                self.ledger
                    .clone()
                    .reserve(req)
                    .await
                    .map(tonic::Response::into_inner)
                    .map_err(Refusal::Reserve),
            )
        } else {
            None
        }
    }

    /// A fork whose reserve was refused stops there; the sandbox made for it meanwhile
    /// is destroyed.
    async fn refused(
        &self,
        mut out: ForkPrepared,
        refusal: Refusal,
        created: Result<Sandbox, tonic::Status>,
    ) -> ForkPrepared {
        match refusal {
            Refusal::Open(msg) => {
                if let Ok(sandbox) = created {
                    out.sandbox = self.discard(sandbox).await;
                }
                out.stop(step::OPEN, "", msg, false)
            }
            Refusal::Reserve(status) => {
                let (ty, retryable) = ledger::error_type(&status);
                if let Ok(sandbox) = created {
                    out.sandbox = self.discard(sandbox).await;
                }
                out.stop(step::RESERVE, ty, ledger::message(&status), retryable)
            }
        }
    }

    /// The new sandbox's health check, asked of the replica that holds it.
    async fn health_check(&self, sandbox: &Sandbox) -> Health {
        Context::current()
            .span()
            .set_attribute(KeyValue::new("forkyard.sandbox_id", sandbox.id.clone()));
        let check = HealthCheckRequest {
            sandbox_id: sandbox.id.clone(),
        };
        let answer = match self.sandboxes.owner_of(&sandbox.owner_endpoint) {
            Ok(mut client) => client.health_check(check).await,
            Err(detail) => {
                return Health::Not {
                    error_type: errors::INVALID_INPUT,
                    detail,
                };
            }
        };
        match answer {
            Ok(h) if h.get_ref().healthy => {
                Health::Ready(forkyard_common::clock::unix_ms(Some(SystemTime::now())))
            }
            Ok(h) => Health::Not {
                error_type: "",
                detail: h.into_inner().detail,
            },
            Err(status) => Health::Not {
                error_type: sandboxes::error_type(&status).0,
                detail: status.message().to_owned(),
            },
        }
    }

    /// Destroy the sandbox of a fork whose reserve was refused; what could not be
    /// destroyed is returned for the workflow to destroy (the fork then is not retried).
    async fn discard(&self, sandbox: Sandbox) -> Option<Sandbox> {
        let at = AtOwner {
            endpoint: sandbox.owner_endpoint.clone(),
            sandbox_id: sandbox.id.clone(),
            reason: "fork has no budget reservation".into(),
        };
        match self.sandboxes.destroy_at(at).await {
            Ok(_) => None,
            Err(error) => {
                tracing::warn!(sandbox_id = %sandbox.id, error = ?error, "cannot destroy the sandbox of a fork without budget");
                Some(sandbox)
            }
        }
    }
}

/// Whether the run's account is open, shared by the wave's forks (at once `Ok` when the
/// wave does not open it).
type Opened = futures::future::Shared<futures::future::BoxFuture<'static, Result<(), String>>>;

/// How a new sandbox's health check answered: healthy (when, the fork's
/// `sandbox_ready_unix_ms`; the workflow's time would be the start of its task), or why not.
enum Health {
    Ready(i64),
    Not {
        error_type: &'static str,
        detail: String,
    },
}

/// What stopped a fork's reserve: the account not opened, or the reserve refused.
enum Refusal {
    Open(String),
    Reserve(tonic::Status),
}

impl Preparer<'_> {
    /// Open the run's account, retried as the run's own open was (5 tries, from 1 s,
    /// doubling); the error says why it stayed shut.
    fn open(&self, open: Option<AccountOpen>) -> Opened {
        let ledger = self.ledger.clone();
        let opening = async move {
            let Some(open) = open else { return Ok(()) };
            let final_error = |s: &tonic::Status| !ledger::error_type(s).1;
            let opened = retried(tries::LEDGER, final_error, || {
                let (mut c, open) = (ledger.clone(), open.clone());
                async move {
                    match open {
                        AccountOpen::Open(req) => c.open_account(req).await.map(drop),
                        AccountOpen::Create(req) => c.create_account(req).await.map(drop),
                    }
                }
            })
            .await;
            opened.map_err(|s| format!("{}: {}", step::OPEN, ledger::message(&s)))
        };
        futures::FutureExt::shared(futures::FutureExt::boxed(opening))
    }
}

/// A span of its own for one fork's calls, under the activity's.
fn fork_span(create: &CreateSandboxRequest) -> Context {
    super::fork_span::span(
        "PrepareFork",
        create.labels.get(labels::RUN_ID).cloned(),
        create
            .labels
            .get(labels::FORK)
            .and_then(|f| f.parse::<i64>().ok()),
    )
}

impl Preparer<'_> {
    /// Prepare every fork of the wave at once; never fails as a whole.
    pub(crate) async fn all(&self, wave: Wave) -> WaveDone {
        let opened = self.open(wave.open);
        let forks = wave.forks.into_iter().map(|item| {
            let opened = opened.clone();
            let cx = fork_span(&item.create);
            let run_id = item.create.labels.get(labels::RUN_ID).cloned();
            let fork = item.create.labels.get(labels::FORK).cloned();
            let this = self;
            async move {
                let out = this
                    .prepare_fork(item, opened)
                    .with_context(cx.clone())
                    .await;
                let span = cx.span();
                if !out.step.is_empty() {
                    tracing::warn!(
                        run_id = run_id.as_deref().unwrap_or_default(),
                        fork = fork.as_deref().unwrap_or_default(),
                        step = out.step,
                        retryable = out.retryable,
                        error = out.error,
                        "fork preparation stopped"
                    );
                    span.set_status(SpanStatus::error(format!("{}: {}", out.step, out.error)));
                }
                span.end();
                out
            }
        });
        WaveDone {
            forks: futures::future::join_all(forks).await,
            open_error: opened.await.err().unwrap_or_default(),
        }
    }
}
