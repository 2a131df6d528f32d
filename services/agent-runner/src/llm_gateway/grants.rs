//! Per-fork tokens. A fork's agent gets a token when its command starts and loses it when
//! the command ends (the grant is dropped): the token is bound to the fork's sandbox, its
//! reservation and its allowed models, and is the only credential the sandbox ever holds.

use crate::{charge::Charger, error::AgentError};
use forkyard_proto::common::v1::Usage;
use std::{
    collections::{BTreeSet, HashMap},
    sync::{
        Arc, Mutex,
        atomic::{AtomicU32, Ordering},
    },
    time::Duration,
};
use tokio::sync::Notify;

/// Which models a grant may ask for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Allowed {
    Any,
    Only(BTreeSet<String>),
}

impl Allowed {
    pub fn permits(&self, model: &str) -> bool {
        match self {
            Self::Any => true,
            Self::Only(set) => set.contains(model),
        }
    }

    pub fn describe(&self) -> String {
        match self {
            Self::Any => "any".into(),
            Self::Only(set) => set.iter().cloned().collect::<Vec<_>>().join(", "),
        }
    }
}

/// What a grant is for.
pub struct GrantSpec {
    pub sandbox_id: String,
    pub run_id: String,
    pub fork: u32,
    pub allowed: Allowed,
    /// Charges each request's price to the fork's reservation; none without one.
    pub charger: Option<Charger>,
    /// How long the fork's requests go on while their charges cannot reach the ledger
    /// (the fork's commit posts them later); then the agent is stopped.
    pub ledger_grace: Duration,
    /// For a sandbox off the mesh's hosts (E2B): its token is taken on the public
    /// listener, where no relay names the sandbox. Other tokens are refused there.
    pub remote: bool,
    /// Where the fork's sandbox is snapshotted for a branch point; none: it cannot be.
    pub snapshotter: Option<super::capture::Snapshotter>,
}

/// Why a grant takes no more requests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stop {
    /// The fork's reservation is spent.
    Spent(String),
    /// Charges have not reached the ledger for longer than the grace.
    LedgerAway(String),
}

/// What the fork's requests came to so far.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Totals {
    pub requests: u32,
    pub usage: Usage,
    pub cost_micros: i64,
    /// What the ledger accepted (a refused or failed charge is in `cost_micros` only).
    pub charged_micros: i64,
    /// Why the fork may not ask for more (its reservation is spent).
    pub exhausted: Option<String>,
    /// The ledger has not taken a charge for longer than the grant's grace.
    pub ledger_away: Option<String>,
    /// Requests the model API failed (unreachable, 429, 5xx), and the last such status
    /// (502 for unreachable): an agent that gives up on them is retried.
    pub upstream_failures: u32,
    pub last_upstream_status: u16,
}

#[derive(Default)]
struct State {
    totals: Totals,
    /// Requests whose charge has not settled yet.
    in_flight: u32,
    /// Of those, requests whose response is done and whose charge is being posted.
    charging: u32,
    /// Charges the ledger did not take.
    ledger_outage: crate::charge::LedgerOutage,
}

pub struct Grant {
    /// Short and random: names the grant in charge keys and logs (never the token).
    pub id: String,
    pub sandbox_id: String,
    pub run_id: String,
    pub fork: u32,
    pub allowed: Allowed,
    /// Taken on the public listener (`GrantSpec::remote`).
    pub remote: bool,
    /// The trace context of the activity that minted the grant: the fork's requests are
    /// traced under it.
    pub trace: forkyard_common::telemetry::otel::Context,
    charger: Option<tokio::sync::Mutex<Charger>>,
    ledger_grace: Duration,
    seq: AtomicU32,
    /// When it was minted (which of a fork's grants is the newer).
    minted: std::time::Instant,
    state: Mutex<State>,
    changed: Notify,
    /// Branch points asked of the running fork (`super::capture`).
    pub captures: super::capture::Captures,
}

impl Grant {
    /// Why a new request must be refused, if it must.
    pub fn stopped(&self) -> Option<Stop> {
        let s = self.state.lock().expect("grant lock");
        match (&s.totals.exhausted, &s.totals.ledger_away) {
            (Some(why), _) => Some(Stop::Spent(why.clone())),
            (None, Some(why)) => Some(Stop::LedgerAway(why.clone())),
            (None, None) => None,
        }
    }

    /// A request starts: its sequence number (the charge key's suffix).
    pub fn begin(&self) -> u32 {
        self.state.lock().expect("grant lock").in_flight += 1;
        self.seq.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// A request's response is done: its charge is coming ([`Self::finish`]), and a
    /// next request waits for it. Called at once, before the charge is even started.
    pub fn delivered(&self) {
        self.state.lock().expect("grant lock").charging += 1;
    }

    /// A request ended having used `usage` at `cost_micros` ([`Self::delivered`] was
    /// called): count it, then charge it
    /// (under `llm-<grant>-<seq>`, so the ledger posts it once however often asked).
    pub async fn finish(&self, seq: u32, usage: Usage, cost_micros: i64) {
        {
            let mut s = self.state.lock().expect("grant lock");
            let t = &mut s.totals;
            t.requests += 1;
            crate::usage_sum::add(&mut t.usage, &usage);
            t.cost_micros += cost_micros;
        }
        let outcome = match &self.charger {
            Some(charger) if cost_micros > 0 => Some(
                charger
                    .lock()
                    .await
                    .charge_as(&format!("llm-{}-{seq}", self.id), seq, cost_micros)
                    .await,
            ),
            _ => None,
        };
        {
            let mut s = self.state.lock().expect("grant lock");
            match outcome {
                Some(Ok(_)) => {
                    s.totals.charged_micros += cost_micros;
                    s.ledger_outage.answered();
                }
                Some(Err(AgentError::Ledger {
                    retry: true,
                    message,
                })) => {
                    let away = s.ledger_outage.failed();
                    tracing::warn!(run_id = %self.run_id, fork = self.fork, grant = %self.id, error = %message, "ledger away: model request not charged yet");
                    if away >= self.ledger_grace && s.totals.ledger_away.is_none() {
                        tracing::warn!(run_id = %self.run_id, fork = self.fork, grant = %self.id, "ledger away past the grace, refusing further model requests");
                        s.totals.ledger_away = Some(format!(
                            "the ledger has not taken a charge for {} s: {message}",
                            away.as_secs()
                        ));
                    }
                }
                Some(Err(AgentError::BudgetExceeded(why))) => {
                    tracing::info!(run_id = %self.run_id, fork = self.fork, grant = %self.id, "fork budget spent, refusing further model requests");
                    s.totals.exhausted = Some(why);
                }
                Some(Err(e)) => {
                    // Spent all the same: the fork's commit posts what was not charged.
                    tracing::warn!(run_id = %self.run_id, fork = self.fork, grant = %self.id, error = %e, "model request charge failed");
                }
                None => {}
            }
            s.in_flight -= 1;
            s.charging -= 1;
        }
        self.changed.notify_waiters();
    }

    /// Wait (up to `limit`) for the charges of responses already delivered, so a new
    /// request is judged against what the fork has really spent: the agent asks again
    /// only after reading an answer, and that answer's charge may still be on its way.
    pub async fn charges_posted(&self, limit: Duration) {
        let _ = tokio::time::timeout(limit, async {
            loop {
                let changed = self.changed.notified();
                if self.state.lock().expect("grant lock").charging == 0 {
                    return;
                }
                changed.await;
            }
        })
        .await;
    }

    /// A delivered response whose charge cannot be posted (the runtime is going away).
    pub fn undeliver(&self) {
        {
            let mut s = self.state.lock().expect("grant lock");
            s.charging -= 1;
            s.in_flight -= 1;
        }
        self.changed.notify_waiters();
    }

    /// The model API failed a request (`status`: its answer, or 502 when unreachable).
    pub fn upstream_failed(&self, status: u16) {
        let mut s = self.state.lock().expect("grant lock");
        s.totals.upstream_failures += 1;
        s.totals.last_upstream_status = status;
    }

    /// A request ended without reaching the model (refused, upstream down).
    pub fn abandon(&self) {
        self.state.lock().expect("grant lock").in_flight -= 1;
        self.changed.notify_waiters();
    }

    pub fn totals(&self) -> Totals {
        self.state.lock().expect("grant lock").totals.clone()
    }
}

/// Every live grant of this replica, by token.
#[derive(Default)]
pub struct Grants {
    by_token: Mutex<HashMap<String, Arc<Grant>>>,
}

impl Grants {
    /// A new token for `spec`, live until the handle is dropped.
    pub fn mint(self: &Arc<Self>, spec: GrantSpec) -> GrantHandle {
        let token = format!(
            "fyk-llm-{}{}",
            uuid::Uuid::new_v4().simple(),
            uuid::Uuid::new_v4().simple()
        );
        let grant = Arc::new(Grant {
            id: uuid::Uuid::new_v4().simple().to_string()[..12].to_owned(),
            sandbox_id: spec.sandbox_id,
            run_id: spec.run_id,
            fork: spec.fork,
            allowed: spec.allowed,
            remote: spec.remote,
            trace: forkyard_common::telemetry::otel::Context::current(),
            charger: spec.charger.map(tokio::sync::Mutex::new),
            ledger_grace: spec.ledger_grace,
            seq: AtomicU32::new(0),
            minted: std::time::Instant::now(),
            state: Mutex::default(),
            changed: Notify::new(),
            captures: super::capture::Captures::new(spec.snapshotter),
        });
        self.by_token
            .lock()
            .expect("grants lock")
            .insert(token.clone(), grant.clone());
        GrantHandle {
            grants: self.clone(),
            token,
            grant,
        }
    }

    pub fn get(&self, token: &str) -> Option<Arc<Grant>> {
        self.by_token
            .lock()
            .expect("grants lock")
            .get(token)
            .cloned()
    }

    /// The live grant of `run_id`'s fork `fork` (a fork runs one agent at a time; of a
    /// retried attempt's two, the newer).
    pub fn of_fork(&self, run_id: &str, fork: u32) -> Option<Arc<Grant>> {
        self.by_token
            .lock()
            .expect("grants lock")
            .values()
            .filter(|g| g.run_id == run_id && g.fork == fork)
            .max_by_key(|g| g.minted)
            .cloned()
    }

    pub fn live(&self) -> usize {
        self.by_token.lock().expect("grants lock").len()
    }
}

/// A live token; dropping it revokes the token (requests in flight finish and are
/// charged).
pub struct GrantHandle {
    grants: Arc<Grants>,
    token: String,
    grant: Arc<Grant>,
}

impl GrantHandle {
    /// The secret the sandbox presents. Only ever put in the sandboxed command's
    /// environment: never logged, never in a Temporal payload.
    pub fn token(&self) -> &str {
        &self.token
    }

    pub fn totals(&self) -> Totals {
        self.grant.totals()
    }

    /// The agent's session id, as the runner read it from the agent's output: a branch
    /// point captured from now on carries it.
    pub fn set_session(&self, session: &str) {
        self.grant.captures.set_session(session);
    }

    /// Whether the agent has sent the gateway any request yet.
    pub fn used(&self) -> bool {
        self.grant.seq.load(Ordering::Relaxed) > 0
    }

    /// Resolves once the fork's reservation refused a charge: the reason.
    /// Once the grant takes no more requests: why.
    pub async fn stopped(&self) -> Stop {
        loop {
            let changed = self.grant.changed.notified();
            if let Some(why) = self.grant.stopped() {
                return why;
            }
            changed.await;
        }
    }

    /// Wait (up to `limit`) until every request's charge has settled: the totals are
    /// then final.
    pub async fn settle(&self, limit: Duration) -> Totals {
        let _ = tokio::time::timeout(limit, async {
            loop {
                let changed = self.grant.changed.notified();
                if self.grant.state.lock().expect("grant lock").in_flight == 0 {
                    return;
                }
                changed.await;
            }
        })
        .await;
        self.grant.totals()
    }
}

impl Drop for GrantHandle {
    fn drop(&mut self) {
        self.grants
            .by_token
            .lock()
            .expect("grants lock")
            .remove(&self.token);
    }
}

impl std::fmt::Debug for GrantHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrantHandle")
            .field("grant", &self.grant.id)
            .finish_non_exhaustive()
    }
}
