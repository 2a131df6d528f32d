//! The ledger's Temporal activities (queue `budget-ledger`), the same operations as the
//! gRPC service, implementing the contracts in `forkyard_proto::activities::Ledger`.
//! Workflows key every mutating call with `<workflow id>/<step>`, stable across retries.

use crate::{error::LedgerError, store::LedgerStore};
use forkyard_proto::budget::v1::{
    Account, ChargeRequest, CommitRequest, CreateAccountRequest, GetAccountRequest,
    GetSpendReportRequest, ListPostingsRequest, ListPostingsResponse, OpenAccountRequest,
    RaiseBudgetRequest, ReleaseRequest, Reservation, ReserveRequest, SpendReport,
};
use std::sync::Arc;
use temporalio_macros::activities;
use temporalio_sdk::activities::{ActivityContext, ActivityError};

pub struct LedgerActivities {
    store: Arc<LedgerStore>,
}

impl LedgerActivities {
    pub fn new(store: Arc<LedgerStore>) -> Self {
        Self { store }
    }
}

fn act<T>(r: Result<T, LedgerError>) -> Result<T, ActivityError> {
    r.map_err(LedgerError::into_activity_error)
}

#[activities]
impl LedgerActivities {
    #[activity(definition = forkyard_proto::activities::markers::ledger::OpenAccount)]
    pub async fn open_account(
        self: Arc<Self>,
        _ctx: ActivityContext,
        req: OpenAccountRequest,
    ) -> Result<Account, ActivityError> {
        act(self.store.open_account(&req).await)
    }

    #[activity(definition = forkyard_proto::activities::markers::ledger::CreateAccount)]
    pub async fn create_account(
        self: Arc<Self>,
        _ctx: ActivityContext,
        req: CreateAccountRequest,
    ) -> Result<Account, ActivityError> {
        act(self.store.create_account(&req).await)
    }

    #[activity(definition = forkyard_proto::activities::markers::ledger::GetAccount)]
    pub async fn get_account(
        self: Arc<Self>,
        _ctx: ActivityContext,
        req: GetAccountRequest,
    ) -> Result<Account, ActivityError> {
        act(self.store.get_account(&req.account_id).await)
    }

    #[activity(definition = forkyard_proto::activities::markers::ledger::RaiseBudget)]
    pub async fn raise_budget(
        self: Arc<Self>,
        _ctx: ActivityContext,
        req: RaiseBudgetRequest,
    ) -> Result<Account, ActivityError> {
        act(self.store.raise_budget(&req).await)
    }

    #[activity(definition = forkyard_proto::activities::markers::ledger::Reserve)]
    pub async fn reserve(
        self: Arc<Self>,
        _ctx: ActivityContext,
        req: ReserveRequest,
    ) -> Result<Reservation, ActivityError> {
        act(self.store.reserve(&req).await)
    }

    #[activity(definition = forkyard_proto::activities::markers::ledger::Charge)]
    pub async fn charge(
        self: Arc<Self>,
        _ctx: ActivityContext,
        req: ChargeRequest,
    ) -> Result<Reservation, ActivityError> {
        act(self.store.charge(&req).await)
    }

    #[activity(definition = forkyard_proto::activities::markers::ledger::Commit)]
    pub async fn commit(
        self: Arc<Self>,
        _ctx: ActivityContext,
        req: CommitRequest,
    ) -> Result<Reservation, ActivityError> {
        act(self.store.commit(&req).await)
    }

    #[activity(definition = forkyard_proto::activities::markers::ledger::Release)]
    pub async fn release(
        self: Arc<Self>,
        _ctx: ActivityContext,
        req: ReleaseRequest,
    ) -> Result<Reservation, ActivityError> {
        act(self.store.release(&req).await)
    }

    #[activity(definition = forkyard_proto::activities::markers::ledger::ListPostings)]
    pub async fn list_postings(
        self: Arc<Self>,
        _ctx: ActivityContext,
        req: ListPostingsRequest,
    ) -> Result<ListPostingsResponse, ActivityError> {
        act(self.store.list_postings(&req).await)
    }

    #[activity(definition = forkyard_proto::activities::markers::ledger::GetSpendReport)]
    pub async fn get_spend_report(
        self: Arc<Self>,
        _ctx: ActivityContext,
        req: GetSpendReportRequest,
    ) -> Result<SpendReport, ActivityError> {
        act(self.store.spend_report(&req).await)
    }
}

/// Worker options for the `budget-ledger` queue with the ledger activities registered.
pub fn worker_options(store: Arc<LedgerStore>) -> temporalio_sdk::WorkerOptions {
    temporalio_sdk::WorkerOptions::new(forkyard_proto::queues::BUDGET_LEDGER)
        .register_activities(LedgerActivities::new(store))
        .build()
}
