//! Loading a batch's working set at the start of its write transaction, a few statements
//! for the whole batch: the reservations its calls name, their accounts with their
//! tenants (locked on PostgreSQL, in account order so that batches of several processes
//! cannot deadlock; SQLite already holds the database), and the idempotency keys.

use crate::{
    db::Backend,
    error::LedgerError,
    model::{self, AccountRow, ReservationRow},
    workset::{StoredKey, WorkSet},
};
use sqlx::{AnyConnection, Row, any::AnyRow};
use std::collections::BTreeSet;

/// Longest `IN (…)` list of one statement. Lists are padded to a power of two (by
/// repeating their last id) so that only a few statement shapes get prepared and cached.
const MAX_IN: usize = 256;

/// What a batch's calls read.
#[derive(Debug, Default)]
pub(crate) struct Wants {
    pub keys: BTreeSet<String>,
    pub accounts: BTreeSet<String>,
    pub reservations: BTreeSet<String>,
}

pub(crate) async fn load(
    conn: &mut AnyConnection,
    backend: Backend,
    wants: Wants,
) -> Result<WorkSet, LedgerError> {
    let mut reservations = reservations(conn, backend, &wants.reservations).await?;
    let mut ids = wants.accounts;
    ids.extend(reservations.iter().map(|r| r.account_id.clone()));
    let mut accounts = if backend.locks_rows() {
        // Learn the tenants first, then lock runs and tenants together in one order.
        let unlocked = select_accounts(conn, backend, &ids, false).await?;
        ids.extend(parents(&unlocked, &BTreeSet::new()));
        let locked = select_accounts(conn, backend, &ids, true).await?;
        // Another process may have settled them while this one waited for the locks.
        reservations = self::reservations(conn, backend, &wants.reservations).await?;
        locked
    } else {
        select_accounts(conn, backend, &ids, false).await?
    };
    loop {
        let have: BTreeSet<String> = accounts.iter().map(|a| a.account_id.clone()).collect();
        let missing = parents(&accounts, &have);
        if missing.is_empty() {
            break;
        }
        let found = select_accounts(conn, backend, &missing, true).await?;
        if found.is_empty() {
            break;
        }
        accounts.extend(found);
    }
    let keys = keys(conn, backend, &wants.keys).await?;
    Ok(WorkSet::new(accounts, reservations, keys))
}

/// The tenants of `accounts` that are not in `have`.
fn parents(accounts: &[AccountRow], have: &BTreeSet<String>) -> BTreeSet<String> {
    accounts
        .iter()
        .map(|a| &a.parent_account_id)
        .filter(|p| !p.is_empty() && !have.contains(*p))
        .cloned()
        .collect()
}

async fn select_accounts(
    conn: &mut AnyConnection,
    backend: Backend,
    ids: &BTreeSet<String>,
    lock: bool,
) -> Result<Vec<AccountRow>, LedgerError> {
    let suffix = if lock { backend.lock_rows() } else { "" };
    let rows = select_in(
        conn,
        backend,
        &format!("{} WHERE account_id IN", model::SELECT_ACCOUNTS),
        &format!("ORDER BY account_id{suffix}"),
        ids,
    )
    .await?;
    rows.iter().map(AccountRow::from_row).collect()
}

async fn reservations(
    conn: &mut AnyConnection,
    backend: Backend,
    ids: &BTreeSet<String>,
) -> Result<Vec<ReservationRow>, LedgerError> {
    let rows = select_in(
        conn,
        backend,
        &format!("{} WHERE reservation_id IN", model::SELECT_RESERVATION),
        "",
        ids,
    )
    .await?;
    rows.iter().map(ReservationRow::from_row).collect()
}

async fn keys(
    conn: &mut AnyConnection,
    backend: Backend,
    keys: &BTreeSet<String>,
) -> Result<Vec<(String, StoredKey)>, LedgerError> {
    let rows = select_in(
        conn,
        backend,
        "SELECT idempotency_key, operation, fingerprint, response, created_unix_ms \
         FROM idempotency_keys WHERE idempotency_key IN",
        "",
        keys,
    )
    .await?;
    rows.iter()
        .map(|r| {
            Ok((
                r.try_get("idempotency_key")?,
                StoredKey {
                    operation: r.try_get("operation")?,
                    fingerprint: r.try_get("fingerprint")?,
                    response: r.try_get("response")?,
                    created_unix_ms: r.try_get("created_unix_ms")?,
                },
            ))
        })
        .collect()
}

/// `{head} ($1, …, $n) {tail}` for every chunk of `ids`, each padded to a power of two.
async fn select_in(
    conn: &mut AnyConnection,
    backend: Backend,
    head: &str,
    tail: &str,
    ids: &BTreeSet<String>,
) -> Result<Vec<AnyRow>, LedgerError> {
    let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
    let mut rows = Vec::new();
    for chunk in ids.chunks(MAX_IN) {
        let n = chunk.len().next_power_of_two();
        let mut sql = format!("{head} (");
        for i in 1..=n {
            if i > 1 {
                sql.push_str(", ");
            }
            backend.push_param(&mut sql, i);
        }
        sql.push_str(") ");
        sql.push_str(tail);
        let mut q = sqlx::query(&sql);
        for i in 0..n {
            q = q.bind(chunk[i.min(chunk.len() - 1)]);
        }
        rows.extend(q.fetch_all(&mut *conn).await?);
    }
    Ok(rows)
}
