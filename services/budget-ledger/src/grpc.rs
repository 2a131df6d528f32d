//! The `forkyard.budget.v1.BudgetLedger` gRPC service over a [`LedgerStore`].

use crate::store::LedgerStore;
use forkyard_proto::budget::v1::{
    Account, ChargeRequest, CommitRequest, CreateAccountRequest, GetAccountRequest,
    GetSpendReportRequest, ListPostingsRequest, ListPostingsResponse, ListReservationsRequest,
    ListReservationsResponse, OpenAccountRequest, RaiseBudgetRequest, ReleaseRequest, Reservation,
    ReserveRequest, SpendReport,
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

type Reply<T> = Result<Response<T>, Status>;

#[tonic::async_trait]
impl BudgetLedger for LedgerService {
    async fn open_account(&self, req: Request<OpenAccountRequest>) -> Reply<Account> {
        Ok(Response::new(self.store.open_account(req.get_ref()).await?))
    }

    async fn create_account(&self, req: Request<CreateAccountRequest>) -> Reply<Account> {
        Ok(Response::new(
            self.store.create_account(req.get_ref()).await?,
        ))
    }

    async fn get_account(&self, req: Request<GetAccountRequest>) -> Reply<Account> {
        Ok(Response::new(
            self.store.get_account(&req.get_ref().account_id).await?,
        ))
    }

    async fn raise_budget(&self, req: Request<RaiseBudgetRequest>) -> Reply<Account> {
        Ok(Response::new(self.store.raise_budget(req.get_ref()).await?))
    }

    async fn reserve(&self, req: Request<ReserveRequest>) -> Reply<Reservation> {
        Ok(Response::new(self.store.reserve(req.get_ref()).await?))
    }

    async fn charge(&self, req: Request<ChargeRequest>) -> Reply<Reservation> {
        Ok(Response::new(self.store.charge(req.get_ref()).await?))
    }

    async fn commit(&self, req: Request<CommitRequest>) -> Reply<Reservation> {
        Ok(Response::new(self.store.commit(req.get_ref()).await?))
    }

    async fn release(&self, req: Request<ReleaseRequest>) -> Reply<Reservation> {
        Ok(Response::new(self.store.release(req.get_ref()).await?))
    }

    async fn list_reservations(
        &self,
        req: Request<ListReservationsRequest>,
    ) -> Reply<ListReservationsResponse> {
        let reservations = self.store.list_reservations(req.get_ref()).await?;
        Ok(Response::new(ListReservationsResponse { reservations }))
    }

    async fn list_postings(
        &self,
        req: Request<ListPostingsRequest>,
    ) -> Reply<ListPostingsResponse> {
        Ok(Response::new(
            self.store.list_postings(req.get_ref()).await?,
        ))
    }

    async fn get_spend_report(&self, req: Request<GetSpendReportRequest>) -> Reply<SpendReport> {
        Ok(Response::new(self.store.spend_report(req.get_ref()).await?))
    }
}
