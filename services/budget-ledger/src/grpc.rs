//! The `forkyard.budget.v1.BudgetLedger` gRPC service over a [`LedgerStore`].

use crate::store::LedgerStore;
use forkyard_proto::budget::v1::{
    Account, CommitRequest, GetAccountRequest, ListReservationsRequest, ListReservationsResponse,
    OpenAccountRequest, RaiseBudgetRequest, ReleaseRequest, Reservation, ReserveRequest,
    budget_ledger_server::{BudgetLedger, BudgetLedgerServer},
};
use std::sync::Arc;
use tonic::{Request, Response, Status};

#[derive(Clone)]
pub struct LedgerService {
    store: Arc<LedgerStore>,
}

impl LedgerService {
    pub fn new(store: Arc<LedgerStore>) -> Self {
        Self { store }
    }

    /// The tonic server wrapping this service.
    pub fn into_server(self) -> BudgetLedgerServer<Self> {
        BudgetLedgerServer::new(self)
    }
}

#[tonic::async_trait]
impl BudgetLedger for LedgerService {
    async fn open_account(
        &self,
        req: Request<OpenAccountRequest>,
    ) -> Result<Response<Account>, Status> {
        Ok(Response::new(self.store.open_account(req.get_ref()).await?))
    }

    async fn get_account(
        &self,
        req: Request<GetAccountRequest>,
    ) -> Result<Response<Account>, Status> {
        Ok(Response::new(
            self.store.get_account(&req.get_ref().account_id).await?,
        ))
    }

    async fn raise_budget(
        &self,
        req: Request<RaiseBudgetRequest>,
    ) -> Result<Response<Account>, Status> {
        Ok(Response::new(self.store.raise_budget(req.get_ref()).await?))
    }

    async fn reserve(&self, req: Request<ReserveRequest>) -> Result<Response<Reservation>, Status> {
        Ok(Response::new(self.store.reserve(req.get_ref()).await?))
    }

    async fn commit(&self, req: Request<CommitRequest>) -> Result<Response<Reservation>, Status> {
        Ok(Response::new(self.store.commit(req.get_ref()).await?))
    }

    async fn release(&self, req: Request<ReleaseRequest>) -> Result<Response<Reservation>, Status> {
        Ok(Response::new(self.store.release(req.get_ref()).await?))
    }

    async fn list_reservations(
        &self,
        req: Request<ListReservationsRequest>,
    ) -> Result<Response<ListReservationsResponse>, Status> {
        let reservations = self.store.list_reservations(req.get_ref()).await?;
        Ok(Response::new(ListReservationsResponse { reservations }))
    }
}
