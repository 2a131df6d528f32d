//! The ledger's Temporal activities (queue `budget-ledger`), the same operations as the
//! gRPC service, implementing the contracts in `forkyard_proto::activities::Ledger`.

use crate::{error::LedgerError, store::LedgerStore};
use forkyard_proto::budget::v1::{
    Account, CommitRequest, OpenAccountRequest, RaiseBudgetRequest, ReleaseRequest, Reservation,
    ReserveRequest,
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

#[activities]
impl LedgerActivities {
    #[activity(definition = forkyard_proto::activities::markers::ledger::OpenAccount)]
    pub async fn open_account(
        self: Arc<Self>,
        _ctx: ActivityContext,
        req: OpenAccountRequest,
    ) -> Result<Account, ActivityError> {
        self.store
            .open_account(&req)
            .await
            .map_err(LedgerError::into_activity_error)
    }

    #[activity(definition = forkyard_proto::activities::markers::ledger::RaiseBudget)]
    pub async fn raise_budget(
        self: Arc<Self>,
        _ctx: ActivityContext,
        req: RaiseBudgetRequest,
    ) -> Result<Account, ActivityError> {
        self.store
            .raise_budget(&req)
            .await
            .map_err(LedgerError::into_activity_error)
    }

    #[activity(definition = forkyard_proto::activities::markers::ledger::Reserve)]
    pub async fn reserve(
        self: Arc<Self>,
        _ctx: ActivityContext,
        req: ReserveRequest,
    ) -> Result<Reservation, ActivityError> {
        self.store
            .reserve(&req)
            .await
            .map_err(LedgerError::into_activity_error)
    }

    #[activity(definition = forkyard_proto::activities::markers::ledger::Commit)]
    pub async fn commit(
        self: Arc<Self>,
        _ctx: ActivityContext,
        req: CommitRequest,
    ) -> Result<Reservation, ActivityError> {
        self.store
            .commit(&req)
            .await
            .map_err(LedgerError::into_activity_error)
    }

    #[activity(definition = forkyard_proto::activities::markers::ledger::Release)]
    pub async fn release(
        self: Arc<Self>,
        _ctx: ActivityContext,
        req: ReleaseRequest,
    ) -> Result<Reservation, ActivityError> {
        self.store
            .release(&req)
            .await
            .map_err(LedgerError::into_activity_error)
    }
}

/// Worker options for the `budget-ledger` queue with the ledger activities registered.
pub fn worker_options(store: Arc<LedgerStore>) -> temporalio_sdk::WorkerOptions {
    temporalio_sdk::WorkerOptions::new(forkyard_proto::queues::BUDGET_LEDGER)
        .register_activities(LedgerActivities::new(store))
        .build()
}
