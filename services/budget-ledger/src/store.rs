//! The ledger's public API over SQLite (WAL, `synchronous = FULL`, the default) or
//! PostgreSQL, with the same SQL and migrations for both (`sqlx::Any`).
//!
//! Mutating calls are validated here, then applied by the group-commit writer
//! ([`crate::writer`]) in a write transaction that checks the idempotency key, locks the
//! accounts, posts one balanced transfer and stores the key with its response, so
//! concurrent calls cannot overspend and a retried call posts once. Reads go straight to
//! the pool.

use crate::{
    accounts,
    db::{self, Backend},
    error::LedgerError,
    model::{self, ReservationRow},
    postings, report, reservations, validate,
    writer::{Op, Reply, Writer},
};
use forkyard_proto::budget::v1::{
    Account, AccountKind, ChargeRequest, CommitRequest, CreateAccountRequest,
    GetSpendReportRequest, ListPostingsRequest, ListPostingsResponse, ListReservationsRequest,
    OpenAccountRequest, RaiseBudgetRequest, ReleaseRequest, Reservation, ReservationState,
    ReserveRequest, SpendReport,
};
use sqlx::AnyPool;
use std::path::Path;

pub use crate::db::MIGRATOR;

pub type Result<T, E = LedgerError> = std::result::Result<T, E>;

/// Handle on the ledger database; cheap to clone.
/// Most reservations one ListReservations returns.
pub const MAX_LISTED_RESERVATIONS: usize = 10_000;

#[derive(Clone, Debug)]
pub struct LedgerStore {
    pool: AnyPool,
    backend: Backend,
    writer: Writer,
}

impl LedgerStore {
    /// Open the database at a `sqlite:` (created if missing) or `postgres:` URL and apply
    /// the migrations.
    pub async fn connect(database_url: &str) -> Result<Self> {
        let (pool, backend) = db::connect(database_url).await?;
        let writer = Writer::spawn(pool.clone(), backend);
        Ok(Self {
            pool,
            backend,
            writer,
        })
    }

    /// Open (creating if missing) the SQLite file at `path` and apply migrations.
    pub async fn open_file(path: &Path) -> Result<Self> {
        Self::connect(&db::sqlite_url(path)).await
    }

    pub fn pool(&self) -> &AnyPool {
        &self.pool
    }

    pub fn backend(&self) -> Backend {
        self.backend
    }

    async fn account_op(&self, op: Op) -> Result<Account> {
        match self.writer.submit(op).await? {
            Reply::Account(a) => Ok(a),
            Reply::Reservation(_) => {
                Err(LedgerError::Corrupt("writer answered a reservation".into()))
            }
        }
    }

    async fn reservation_op(&self, op: Op) -> Result<Reservation> {
        match self.writer.submit(op).await? {
            Reply::Reservation(r) => Ok(r),
            Reply::Account(_) => Err(LedgerError::Corrupt("writer answered an account".into())),
        }
    }

    /// A stand-alone run account: `CreateAccount` with kind RUN, keyed as `open_account`.
    pub async fn open_account(&self, req: &OpenAccountRequest) -> Result<Account> {
        validate::non_empty("account_id", &req.account_id)?;
        validate::amount("budget_micros", req.budget_micros, false)?;
        validate::non_empty("idempotency_key", &req.idempotency_key)?;
        let fp = crate::idempotency::fingerprint(&OpenAccountRequest {
            idempotency_key: String::new(),
            ..req.clone()
        })?;
        let create = CreateAccountRequest {
            account_id: req.account_id.clone(),
            kind: AccountKind::Run as i32,
            budget_micros: req.budget_micros,
            idempotency_key: req.idempotency_key.clone(),
            ..Default::default()
        };
        self.account_op(Op::Create {
            req: create,
            op: "open_account",
            fp,
        })
        .await
    }

    pub async fn create_account(&self, req: &CreateAccountRequest) -> Result<Account> {
        validate::non_empty("account_id", &req.account_id)?;
        validate::amount("budget_micros", req.budget_micros, false)?;
        validate::non_empty("idempotency_key", &req.idempotency_key)?;
        let kind = AccountKind::try_from(req.kind).map_err(|_| {
            LedgerError::invalid("kind", format!("unknown account kind {}", req.kind))
        })?;
        if kind == AccountKind::Tenant && !req.parent_account_id.is_empty() {
            return Err(LedgerError::invalid(
                "parent_account_id",
                "a tenant account has no parent",
            ));
        }
        if req.parent_account_id == req.account_id {
            return Err(LedgerError::invalid(
                "parent_account_id",
                "an account cannot be its own parent",
            ));
        }
        forkyard_proto::budget::v1::CommitOverage::try_from(req.commit_overage).map_err(|_| {
            LedgerError::invalid(
                "commit_overage",
                format!("unknown policy {}", req.commit_overage),
            )
        })?;
        let fp = accounts::create_fingerprint(req)?;
        self.account_op(Op::Create {
            req: req.clone(),
            op: "create_account",
            fp,
        })
        .await
    }

    /// Add `amount_micros` (> 0) to an account's budget.
    pub async fn raise_budget(&self, req: &RaiseBudgetRequest) -> Result<Account> {
        validate::non_empty("account_id", &req.account_id)?;
        validate::amount("amount_micros", req.amount_micros, true)?;
        validate::non_empty("idempotency_key", &req.idempotency_key)?;
        self.account_op(Op::Raise(req.clone())).await
    }

    pub async fn get_account(&self, account_id: &str) -> Result<Account> {
        validate::non_empty("account_id", account_id)?;
        let mut conn = self.pool.acquire().await?;
        Ok(accounts::require(&mut conn, account_id).await?.to_proto())
    }

    pub async fn reserve(&self, req: &ReserveRequest) -> Result<Reservation> {
        validate::non_empty("account_id", &req.account_id)?;
        validate::amount("amount_micros", req.amount_micros, true)?;
        validate::non_empty("idempotency_key", &req.idempotency_key)?;
        self.reservation_op(Op::Reserve(req.clone())).await
    }

    pub async fn charge(&self, req: &ChargeRequest) -> Result<Reservation> {
        validate::non_empty("reservation_id", &req.reservation_id)?;
        validate::amount("amount_micros", req.amount_micros, true)?;
        validate::non_empty("idempotency_key", &req.idempotency_key)?;
        self.reservation_op(Op::Charge(req.clone())).await
    }

    pub async fn commit(&self, req: &CommitRequest) -> Result<Reservation> {
        validate::non_empty("reservation_id", &req.reservation_id)?;
        validate::amount("amount_micros", req.amount_micros, false)?;
        validate::non_empty("idempotency_key", &req.idempotency_key)?;
        self.reservation_op(Op::Commit(req.clone())).await
    }

    pub async fn release(&self, req: &ReleaseRequest) -> Result<Reservation> {
        validate::non_empty("reservation_id", &req.reservation_id)?;
        validate::non_empty("idempotency_key", &req.idempotency_key)?;
        self.reservation_op(Op::Release(req.clone())).await
    }

    /// One account's reservations, or — with no account — every reservation in one state
    /// (the janitor's view of what is still HELD), oldest first, at most
    /// `MAX_LISTED_RESERVATIONS`.
    pub async fn list_reservations(
        &self,
        req: &ListReservationsRequest,
    ) -> Result<Vec<Reservation>> {
        let state = ReservationState::try_from(req.state).map_err(|_| {
            LedgerError::invalid("state", format!("unknown reservation state {}", req.state))
        })?;
        if req.account_id.is_empty() && state == ReservationState::Unspecified {
            return Err(LedgerError::invalid(
                "account_id",
                "must not be empty unless a state is given",
            ));
        }
        let mut conn = self.pool.acquire().await?;
        if !req.account_id.is_empty() {
            accounts::require(&mut conn, &req.account_id).await?;
        }
        let order =
            format!("ORDER BY created_unix_ms, reservation_id LIMIT {MAX_LISTED_RESERVATIONS}");
        let rows = match (
            req.account_id.is_empty(),
            state == ReservationState::Unspecified,
        ) {
            (false, true) => {
                sqlx::query(&format!(
                    "{} WHERE account_id = $1 {order}",
                    model::SELECT_RESERVATION
                ))
                .bind(&req.account_id)
                .fetch_all(&mut *conn)
                .await?
            }
            (false, false) => {
                sqlx::query(&format!(
                    "{} WHERE account_id = $1 AND state = $2 {order}",
                    model::SELECT_RESERVATION
                ))
                .bind(&req.account_id)
                .bind(model::state_str(state))
                .fetch_all(&mut *conn)
                .await?
            }
            _ => {
                sqlx::query(&format!(
                    "{} WHERE state = $1 {order}",
                    model::SELECT_RESERVATION
                ))
                .bind(model::state_str(state))
                .fetch_all(&mut *conn)
                .await?
            }
        };
        rows.iter()
            .map(|r| ReservationRow::from_row(r).map(ReservationRow::into_proto))
            .collect()
    }

    pub async fn get_reservation(&self, reservation_id: &str) -> Result<Reservation> {
        validate::non_empty("reservation_id", reservation_id)?;
        let mut conn = self.pool.acquire().await?;
        Ok(reservations::require_reservation(&mut conn, reservation_id)
            .await?
            .into_proto())
    }

    pub async fn list_postings(&self, req: &ListPostingsRequest) -> Result<ListPostingsResponse> {
        validate::non_empty("account_id", &req.account_id)?;
        let mut conn = self.pool.acquire().await?;
        accounts::require(&mut conn, &req.account_id).await?;
        postings::list(&mut conn, req).await
    }

    pub async fn spend_report(&self, req: &GetSpendReportRequest) -> Result<SpendReport> {
        let mut conn = self.pool.acquire().await?;
        if !req.account_id.is_empty() {
            accounts::require(&mut conn, &req.account_id).await?;
        }
        report::spend_report(&mut conn, req).await
    }

    /// Re-derives every balance from the postings; returns the discrepancies (none when
    /// the books are right).
    pub async fn audit(&self) -> Result<Vec<String>> {
        let mut conn = self.pool.acquire().await?;
        postings::audit(&mut conn).await
    }
}
