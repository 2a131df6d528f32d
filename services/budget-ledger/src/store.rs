//! The ledger's storage: accounts, reservations and idempotency keys in SQLite (WAL,
//! `synchronous = FULL`), with portable SQL so PostgreSQL can follow through the same code.
//!
//! Every mutating operation runs in one transaction that takes the write lock up front
//! (`BEGIN IMMEDIATE`): it checks the idempotency key, reads the balances, applies the
//! effect and stores the key with its response, so concurrent calls cannot overspend and a
//! retried call posts once.

use crate::{
    error::LedgerError,
    model::{self, ReservationRow},
    validate,
};
use forkyard_proto::budget::v1::{
    Account, CommitRequest, ListReservationsRequest, OpenAccountRequest, RaiseBudgetRequest,
    ReleaseRequest, Reservation, ReservationState, ReserveRequest,
};
use serde::{Serialize, de::DeserializeOwned};
use sqlx::{
    Row, SqliteConnection, SqlitePool,
    migrate::Migrator,
    sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous},
};
use std::{path::Path, str::FromStr, time::Duration};

pub type Result<T, E = LedgerError> = std::result::Result<T, E>;

/// The schema, embedded from `services/budget-ledger/migrations/`.
pub static MIGRATOR: Migrator = sqlx::migrate!("./migrations");

/// How long a writer waits for another writer's lock before failing with "busy".
const BUSY_TIMEOUT: Duration = Duration::from_secs(15);

/// Handle on the ledger database; cheap to clone.
#[derive(Clone, Debug)]
pub struct LedgerStore {
    pool: SqlitePool,
}

impl LedgerStore {
    /// Open (creating if missing) the database at a `sqlite:` URL and apply migrations.
    pub async fn connect(database_url: &str) -> Result<Self> {
        if !database_url.starts_with("sqlite:") {
            return Err(LedgerError::invalid(
                "database_url",
                format!("{database_url:?}: only sqlite: URLs are supported"),
            ));
        }
        let opts = SqliteConnectOptions::from_str(database_url)?;
        Self::connect_with(opts).await
    }

    /// Open (creating if missing) the SQLite file at `path` and apply migrations.
    pub async fn open_file(path: &Path) -> Result<Self> {
        Self::connect_with(SqliteConnectOptions::new().filename(path)).await
    }

    async fn connect_with(opts: SqliteConnectOptions) -> Result<Self> {
        let opts = opts
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(BUSY_TIMEOUT)
            .foreign_keys(true);
        let pool = SqlitePoolOptions::new()
            .max_connections(8)
            .acquire_timeout(Duration::from_secs(30))
            .connect_with(opts)
            .await?;
        MIGRATOR.run(&pool).await?;
        Ok(Self { pool })
    }

    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    pub async fn open_account(&self, req: &OpenAccountRequest) -> Result<Account> {
        validate::non_empty("account_id", &req.account_id)?;
        validate::non_negative("budget_micros", req.budget_micros)?;
        validate::non_empty("idempotency_key", &req.idempotency_key)?;
        let op = "open_account";
        let fp = fingerprint(&OpenAccountRequest {
            idempotency_key: String::new(),
            ..req.clone()
        })?;

        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        if let Some(resp) = replay(&mut tx, op, &req.idempotency_key, &fp).await? {
            return Ok(resp);
        }
        match load_account(&mut tx, &req.account_id).await? {
            Some(existing) if existing.budget_micros != req.budget_micros => {
                return Err(LedgerError::AlreadyExists(format!(
                    "account {:?} already exists with budget {} micros (requested {})",
                    req.account_id, existing.budget_micros, req.budget_micros
                )));
            }
            Some(_) => {}
            None => {
                sqlx::query(
                    "INSERT INTO accounts (account_id, budget_micros, created_unix_ms) \
                     VALUES ($1, $2, $3)",
                )
                .bind(&req.account_id)
                .bind(req.budget_micros)
                .bind(model::now_ms())
                .execute(&mut *tx)
                .await?;
            }
        }
        let account = require_account(&mut tx, &req.account_id).await?;
        remember(&mut tx, op, &req.idempotency_key, &fp, &account).await?;
        tx.commit().await?;
        Ok(account)
    }

    /// Add `amount_micros` (> 0) to an account's budget.
    pub async fn raise_budget(&self, req: &RaiseBudgetRequest) -> Result<Account> {
        validate::non_empty("account_id", &req.account_id)?;
        validate::positive("amount_micros", req.amount_micros)?;
        validate::non_empty("idempotency_key", &req.idempotency_key)?;
        let op = "raise_budget";
        let fp = fingerprint(&RaiseBudgetRequest {
            idempotency_key: String::new(),
            ..req.clone()
        })?;
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        if let Some(resp) = replay(&mut tx, op, &req.idempotency_key, &fp).await? {
            return Ok(resp);
        }
        let before = require_account(&mut tx, &req.account_id).await?;
        let budget = before
            .budget_micros
            .checked_add(req.amount_micros)
            .ok_or_else(|| {
                LedgerError::invalid(
                    "amount_micros",
                    format!(
                        "raising {} by {} overflows",
                        before.budget_micros, req.amount_micros
                    ),
                )
            })?;
        sqlx::query("UPDATE accounts SET budget_micros = $1 WHERE account_id = $2")
            .bind(budget)
            .bind(&req.account_id)
            .execute(&mut *tx)
            .await?;
        let account = require_account(&mut tx, &req.account_id).await?;
        remember(&mut tx, op, &req.idempotency_key, &fp, &account).await?;
        tx.commit().await?;
        Ok(account)
    }

    pub async fn get_account(&self, account_id: &str) -> Result<Account> {
        validate::non_empty("account_id", account_id)?;
        let mut conn = self.pool.acquire().await?;
        require_account(&mut conn, account_id).await
    }

    pub async fn reserve(&self, req: &ReserveRequest) -> Result<Reservation> {
        validate::non_empty("account_id", &req.account_id)?;
        validate::positive("amount_micros", req.amount_micros)?;
        validate::non_empty("idempotency_key", &req.idempotency_key)?;
        let op = "reserve";
        let fp = fingerprint(&ReserveRequest {
            idempotency_key: String::new(),
            ..req.clone()
        })?;

        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        if let Some(resp) = replay(&mut tx, op, &req.idempotency_key, &fp).await? {
            return Ok(resp);
        }
        let account = require_account(&mut tx, &req.account_id).await?;
        if req.amount_micros > account.available_micros {
            return Err(LedgerError::BudgetExceeded(format!(
                "account {:?}: reserving {} micros but only {} available (budget {}, reserved {}, spent {})",
                account.account_id,
                req.amount_micros,
                account.available_micros,
                account.budget_micros,
                account.reserved_micros,
                account.spent_micros
            )));
        }
        let id = format!("rsv-{}", uuid::Uuid::new_v4().simple());
        sqlx::query(
            "INSERT INTO reservations \
             (reservation_id, account_id, amount_micros, state, committed_micros, budget_exceeded, holder, created_unix_ms) \
             VALUES ($1, $2, $3, $4, 0, 0, $5, $6)",
        )
        .bind(&id)
        .bind(&req.account_id)
        .bind(req.amount_micros)
        .bind(model::state_str(ReservationState::Held))
        .bind(&req.holder)
        .bind(model::now_ms())
        .execute(&mut *tx)
        .await?;
        let reservation = require_reservation(&mut tx, &id).await?.into_proto();
        remember(&mut tx, op, &req.idempotency_key, &fp, &reservation).await?;
        tx.commit().await?;
        Ok(reservation)
    }

    pub async fn commit(&self, req: &CommitRequest) -> Result<Reservation> {
        validate::non_empty("reservation_id", &req.reservation_id)?;
        validate::non_negative("amount_micros", req.amount_micros)?;
        validate::non_empty("idempotency_key", &req.idempotency_key)?;
        let op = "commit";
        let fp = fingerprint(&CommitRequest {
            idempotency_key: String::new(),
            ..req.clone()
        })?;

        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        if let Some(resp) = replay(&mut tx, op, &req.idempotency_key, &fp).await? {
            return Ok(resp);
        }
        let rsv = require_reservation(&mut tx, &req.reservation_id).await?;
        if rsv.state != ReservationState::Held {
            return Err(LedgerError::FailedPrecondition(format!(
                "reservation {} is {}, not HELD: it cannot be committed (again)",
                rsv.reservation_id,
                model::state_str(rsv.state)
            )));
        }
        let account = require_account(&mut tx, &rsv.account_id).await?;
        let (committed, exceeded) = model::cap_commit(
            req.amount_micros,
            rsv.amount_micros,
            account.available_micros,
        );
        if exceeded {
            tracing::warn!(
                reservation_id = %rsv.reservation_id,
                account_id = %rsv.account_id,
                requested = req.amount_micros,
                committed,
                "commit capped: budget exceeded"
            );
        }
        sqlx::query(
            "UPDATE reservations SET state = $1, committed_micros = $2, budget_exceeded = $3 \
             WHERE reservation_id = $4 AND state = $5",
        )
        .bind(model::state_str(ReservationState::Committed))
        .bind(committed)
        .bind(i64::from(exceeded))
        .bind(&rsv.reservation_id)
        .bind(model::state_str(ReservationState::Held))
        .execute(&mut *tx)
        .await?;
        let reservation = require_reservation(&mut tx, &rsv.reservation_id)
            .await?
            .into_proto();
        remember(&mut tx, op, &req.idempotency_key, &fp, &reservation).await?;
        tx.commit().await?;
        Ok(reservation)
    }

    pub async fn release(&self, req: &ReleaseRequest) -> Result<Reservation> {
        validate::non_empty("reservation_id", &req.reservation_id)?;
        validate::non_empty("idempotency_key", &req.idempotency_key)?;
        let op = "release";
        let fp = fingerprint(&ReleaseRequest {
            idempotency_key: String::new(),
            ..req.clone()
        })?;

        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        if let Some(resp) = replay(&mut tx, op, &req.idempotency_key, &fp).await? {
            return Ok(resp);
        }
        let rsv = require_reservation(&mut tx, &req.reservation_id).await?;
        match rsv.state {
            ReservationState::Held => {
                sqlx::query(
                    "UPDATE reservations SET state = $1 WHERE reservation_id = $2 AND state = $3",
                )
                .bind(model::state_str(ReservationState::Released))
                .bind(&rsv.reservation_id)
                .bind(model::state_str(ReservationState::Held))
                .execute(&mut *tx)
                .await?;
            }
            ReservationState::Released => {}
            other => {
                return Err(LedgerError::FailedPrecondition(format!(
                    "reservation {} is {}: only a HELD reservation can be released",
                    rsv.reservation_id,
                    model::state_str(other)
                )));
            }
        }
        let reservation = require_reservation(&mut tx, &rsv.reservation_id)
            .await?
            .into_proto();
        remember(&mut tx, op, &req.idempotency_key, &fp, &reservation).await?;
        tx.commit().await?;
        Ok(reservation)
    }

    pub async fn list_reservations(
        &self,
        req: &ListReservationsRequest,
    ) -> Result<Vec<Reservation>> {
        validate::non_empty("account_id", &req.account_id)?;
        let state = ReservationState::try_from(req.state).map_err(|_| {
            LedgerError::invalid("state", format!("unknown reservation state {}", req.state))
        })?;
        let mut conn = self.pool.acquire().await?;
        require_account(&mut conn, &req.account_id).await?;
        let rows = if state == ReservationState::Unspecified {
            sqlx::query(&format!(
                "{} WHERE account_id = $1 ORDER BY created_unix_ms, reservation_id",
                model::SELECT_RESERVATION
            ))
            .bind(&req.account_id)
            .fetch_all(&mut *conn)
            .await?
        } else {
            sqlx::query(&format!(
                "{} WHERE account_id = $1 AND state = $2 ORDER BY created_unix_ms, reservation_id",
                model::SELECT_RESERVATION
            ))
            .bind(&req.account_id)
            .bind(model::state_str(state))
            .fetch_all(&mut *conn)
            .await?
        };
        rows.iter()
            .map(|r| ReservationRow::from_row(r).map(ReservationRow::into_proto))
            .collect()
    }
}

/// The request without its idempotency key, as canonical JSON (fixed field order).
fn fingerprint<T: Serialize>(req: &T) -> Result<String> {
    serde_json::to_string(req)
        .map_err(|e| LedgerError::Corrupt(format!("cannot encode request: {e}")))
}

/// The stored response of an earlier call with this key, or `None` if the key is new.
async fn replay<R: DeserializeOwned>(
    conn: &mut SqliteConnection,
    operation: &str,
    key: &str,
    fingerprint: &str,
) -> Result<Option<R>> {
    let Some(row) = sqlx::query(
        "SELECT operation, fingerprint, response FROM idempotency_keys WHERE idempotency_key = $1",
    )
    .bind(key)
    .fetch_optional(&mut *conn)
    .await?
    else {
        return Ok(None);
    };
    let stored_op: String = row.try_get("operation")?;
    let stored_fp: String = row.try_get("fingerprint")?;
    if stored_op != operation || stored_fp != fingerprint {
        return Err(LedgerError::KeyReused {
            key: key.to_owned(),
            operation: stored_op,
        });
    }
    let response: String = row.try_get("response")?;
    let resp = serde_json::from_str(&response)
        .map_err(|e| LedgerError::Corrupt(format!("stored response for key {key:?}: {e}")))?;
    Ok(Some(resp))
}

/// Store the key with its response, in the caller's transaction.
async fn remember<R: Serialize>(
    conn: &mut SqliteConnection,
    operation: &str,
    key: &str,
    fingerprint: &str,
    response: &R,
) -> Result<()> {
    let response = serde_json::to_string(response)
        .map_err(|e| LedgerError::Corrupt(format!("cannot encode response: {e}")))?;
    sqlx::query(
        "INSERT INTO idempotency_keys (idempotency_key, operation, fingerprint, response, created_unix_ms) \
         VALUES ($1, $2, $3, $4, $5)",
    )
    .bind(key)
    .bind(operation)
    .bind(fingerprint)
    .bind(response)
    .bind(model::now_ms())
    .execute(&mut *conn)
    .await?;
    Ok(())
}

async fn load_account(conn: &mut SqliteConnection, account_id: &str) -> Result<Option<Account>> {
    let row = sqlx::query(model::SELECT_ACCOUNT)
        .bind(account_id)
        .fetch_optional(&mut *conn)
        .await?;
    row.map(|r| model::account_from_row(&r)).transpose()
}

async fn require_account(conn: &mut SqliteConnection, account_id: &str) -> Result<Account> {
    load_account(conn, account_id)
        .await?
        .ok_or_else(|| LedgerError::NotFound(format!("account {account_id:?} not found")))
}

async fn require_reservation(
    conn: &mut SqliteConnection,
    reservation_id: &str,
) -> Result<ReservationRow> {
    let row = sqlx::query(&format!(
        "{} WHERE reservation_id = $1",
        model::SELECT_RESERVATION
    ))
    .bind(reservation_id)
    .fetch_optional(&mut *conn)
    .await?
    .ok_or_else(|| LedgerError::NotFound(format!("reservation {reservation_id:?} not found")))?;
    ReservationRow::from_row(&row)
}
