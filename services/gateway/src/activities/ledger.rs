//! The run workflows' ledger calls, run as local activities of the gateway's worker that
//! call budget-ledger over gRPC.
//!
//! Why local: a ledger call is short, and each fork makes two or three of them. As
//! regular activities on the `budget-ledger` queue each costs a matched task, three
//! history events and a workflow-task round trip; as local activities each is one marker
//! recorded with the workflow task that ran it. On the fan-out benchmark that was the
//! largest single share of the Temporal server's CPU per fork (docs/performance.md).
//! Every mutating request carries an idempotency key (`<workflow id>/a<attempt>/<step>`),
//! so a local activity that runs again after a gateway crash does not apply twice.
//!
//! A wave of forks reserves its budget in the wave's one local activity (`super::wave`),
//! through [`LedgerLocal::client`]; its reserves go to the ledger at once, whose writer
//! commits them in one or a few transactions.
//!
//! The failures mirror the ledger's own activities (`forkyard_proto::activities::errors`),
//! so the workflows classify them the same way.

use forkyard_common::activity::{non_retryable, retryable};
use forkyard_proto::{
    activities::errors,
    budget::v1::{
        Account, CommitRequest, CreateAccountRequest, OpenAccountRequest, RaiseBudgetRequest,
        ReleaseRequest, Reservation, budget_ledger_client::BudgetLedgerClient,
    },
};
use std::{sync::Arc, time::Duration};
use temporalio_macros::activities;
use temporalio_sdk::activities::{ActivityContext, ActivityError};
use tonic::{Code, Status};

pub(crate) type Client = BudgetLedgerClient<forkyard_common::grpc_telemetry::TracedChannel>;

/// Longest a single ledger call may take before it is retried.
const CALL_DEADLINE: Duration = Duration::from_secs(10);

pub struct LedgerLocal {
    // Traced: each call is a span under the fork's local-activity span, and carries the
    // trace on to budget-ledger.
    client: Client,
}

impl LedgerLocal {
    /// `endpoint` is budget-ledger's gRPC address; the channel connects on first use (and
    /// reconnects), so the gateway starts even while the ledger is still coming up.
    pub fn new(endpoint: &str) -> Result<Self, String> {
        let channel = forkyard_common::discovery::balanced(
            "--ledger-addr (FORKYARD_LEDGER_ADDR)",
            endpoint,
            |ep| {
                ep.connect_timeout(Duration::from_secs(5))
                    .timeout(CALL_DEADLINE)
            },
        )?;
        Ok(Self {
            client: BudgetLedgerClient::new(forkyard_common::grpc_telemetry::traced_channel(
                channel,
            )),
        })
    }

    pub(crate) fn client(&self) -> Client {
        self.client.clone()
    }
}

/// The ledger's status codes as the error types its own worker would raise, and whether
/// trying again may help. Budget exhaustion travels as FAILED_PRECONDITION with a
/// "budget exceeded" message (see budget-ledger's error mapping).
pub(crate) fn error_type(status: &Status) -> (&'static str, bool) {
    match status.code() {
        Code::FailedPrecondition if status.message().starts_with("budget exceeded") => {
            (errors::BUDGET_EXCEEDED, false)
        }
        Code::FailedPrecondition => ("FailedPrecondition", false),
        Code::InvalidArgument => (errors::INVALID_INPUT, false),
        Code::NotFound => (errors::NOT_FOUND, false),
        Code::AlreadyExists => ("AlreadyExists", false),
        _ => ("LedgerUnavailable", true),
    }
}

pub(crate) fn message(status: &Status) -> String {
    format!("ledger: {}", status.message())
}

fn failure(status: Status) -> ActivityError {
    let msg = message(&status);
    match error_type(&status) {
        (ty, true) => retryable(ty, msg),
        (ty, false) => non_retryable(ty, msg),
    }
}

fn unwrap<T>(r: Result<tonic::Response<T>, Status>) -> Result<T, ActivityError> {
    r.map(tonic::Response::into_inner).map_err(failure)
}

#[activities]
impl LedgerLocal {
    #[activity(definition = forkyard_proto::activities::markers::ledger::OpenAccount)]
    pub async fn open_account(
        self: Arc<Self>,
        _ctx: ActivityContext,
        req: OpenAccountRequest,
    ) -> Result<Account, ActivityError> {
        unwrap(self.client.clone().open_account(req).await)
    }

    #[activity(definition = forkyard_proto::activities::markers::ledger::CreateAccount)]
    pub async fn create_account(
        self: Arc<Self>,
        _ctx: ActivityContext,
        req: CreateAccountRequest,
    ) -> Result<Account, ActivityError> {
        unwrap(self.client.clone().create_account(req).await)
    }

    #[activity(definition = forkyard_proto::activities::markers::ledger::RaiseBudget)]
    pub async fn raise_budget(
        self: Arc<Self>,
        _ctx: ActivityContext,
        req: RaiseBudgetRequest,
    ) -> Result<Account, ActivityError> {
        unwrap(self.client.clone().raise_budget(req).await)
    }

    #[activity(definition = forkyard_proto::activities::markers::ledger::Commit)]
    pub async fn commit(
        self: Arc<Self>,
        _ctx: ActivityContext,
        req: CommitRequest,
    ) -> Result<Reservation, ActivityError> {
        unwrap(self.client.clone().commit(req).await)
    }

    #[activity(definition = forkyard_proto::activities::markers::ledger::Release)]
    pub async fn release(
        self: Arc<Self>,
        _ctx: ActivityContext,
        req: ReleaseRequest,
    ) -> Result<Reservation, ActivityError> {
        unwrap(self.client.clone().release(req).await)
    }
}
