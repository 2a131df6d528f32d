//! Incremental charges to the ledger, one per model turn, keyed `<charge_key>/turn-<n>`
//! so a retried activity attempt that repeats a charge posts nothing new.

use crate::error::AgentError;
use forkyard_common::grpc_telemetry::TracedChannel as Channel;
use forkyard_proto::budget::v1::{
    ChargeRequest, SpendAttribution, budget_ledger_client::BudgetLedgerClient,
};
use std::time::Duration;
use tonic::Code;

/// How long an agent keeps running, unmetered, while the ledger does not answer: a
/// short outage must not fail a fork, a long one must not let it spend unchecked.
pub const LEDGER_OUTAGE_GRACE: Duration = Duration::from_secs(120);

/// Since when an agent's charges have failed because the ledger did not answer (its
/// spend is posted by the fork's commit, which waits for the ledger): every agent kind
/// goes on within the grace and stops after it.
#[derive(Debug, Default)]
pub struct LedgerOutage {
    since: Option<std::time::Instant>,
}

impl LedgerOutage {
    /// A charge reached the ledger: the outage, if any, is over.
    pub fn answered(&mut self) {
        self.since = None;
    }

    /// A charge failed because the ledger did not answer: how long it has been away
    /// (since the first such failure).
    pub fn failed(&mut self) -> Duration {
        self.since
            .get_or_insert_with(std::time::Instant::now)
            .elapsed()
    }
}

#[derive(Clone)]
pub struct Charger {
    pub client: BudgetLedgerClient<Channel>,
    pub reservation_id: String,
    pub key_prefix: String,
    pub run_id: String,
    pub fork: u32,
    pub model: String,
    /// The activity attempt: a key the ledger saw with another amount (a turn a failed
    /// attempt charged but could not heartbeat) is posted under a key naming it.
    pub activity_attempt: u32,
}

impl Charger {
    /// Charge `amount` for `turn`; the reservation's total charges so far.
    pub async fn charge(&mut self, turn: u32, amount: i64) -> Result<i64, AgentError> {
        self.charge_as(&format!("turn-{turn}"), turn, amount).await
    }

    /// Charge `amount` under the key `<prefix>/<name>` (`turn` is for the logs). Traced as
    /// a `ledger.charge` span over every try, its gRPC calls under it.
    #[tracing::instrument(
        name = "ledger.charge",
        skip_all,
        fields(run_id = %self.run_id, fork = self.fork, turn = turn, amount_micros = amount, tries = tracing::field::Empty)
    )]
    pub async fn charge_as(
        &mut self,
        name: &str,
        turn: u32,
        amount: i64,
    ) -> Result<i64, AgentError> {
        if amount <= 0 {
            return Ok(0);
        }
        let mut key = format!("{}/{name}", self.key_prefix);
        let mut delay = Duration::from_millis(200);
        let mut tries = 0;
        loop {
            tries += 1;
            tracing::Span::current().record("tries", tries);
            let req = ChargeRequest {
                reservation_id: self.reservation_id.clone(),
                amount_micros: amount,
                attribution: Some(SpendAttribution {
                    run_id: self.run_id.clone(),
                    fork: String::new(),
                    model: self.model.clone(),
                }),
                idempotency_key: key.clone(),
            };
            match self.client.charge(req).await {
                Ok(r) => return Ok(r.into_inner().charged_micros),
                Err(s) if s.code() == Code::FailedPrecondition => {
                    return Err(AgentError::BudgetExceeded(s.message().to_owned()));
                }
                Err(s)
                    if s.code() == Code::InvalidArgument
                        && s.message().contains("idempotency key reused")
                        && !key.ends_with(&format!("/a{}", self.activity_attempt)) =>
                {
                    tracing::warn!(run_id = %self.run_id, fork = self.fork, turn, "turn was charged by a failed attempt with another amount; charging the repeat separately");
                    key = format!("{key}/a{}", self.activity_attempt);
                }
                Err(s)
                    if matches!(s.code(), Code::Unavailable | Code::Unknown | Code::Internal)
                        && tries < 5 =>
                {
                    tracing::warn!(run_id = %self.run_id, fork = self.fork, turn, error = %s.message(), "charge failed, retrying");
                    tokio::time::sleep(delay).await;
                    delay *= 2;
                }
                Err(s) => {
                    let retry =
                        matches!(s.code(), Code::Unavailable | Code::Unknown | Code::Internal);
                    return Err(AgentError::Ledger {
                        message: s.message().to_owned(),
                        retry,
                    });
                }
            }
        }
    }
}
