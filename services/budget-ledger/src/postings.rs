//! Double entry: transfers and their postings (legs), the balances they keep, paging
//! through an account's postings, and the audit that re-derives every balance.

use crate::{
    error::LedgerError,
    model::{self, AccountRow},
    workset::{PostingRow, TransferRow, WorkSet},
};
use forkyard_proto::budget::v1::{Bucket, ListPostingsRequest, ListPostingsResponse, Posting};
use sqlx::{AnyConnection, Row};

/// The change a transfer makes to each account of a chain: one leg per non-zero bucket
/// delta. The deltas sum to zero.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Deltas {
    pub funding: i64,
    pub available: i64,
    pub reserved: i64,
    pub spent: i64,
}

/// What the transfer row records besides its legs.
#[derive(Debug, Default)]
pub(crate) struct TransferMeta<'a> {
    pub kind: &'static str,
    pub reservation_id: &'a str,
    pub amount_micros: i64,
    pub run_id: &'a str,
    pub fork: &'a str,
    pub model: &'a str,
    pub idempotency_key: &'a str,
}

/// Posts one balanced transfer: the same legs on every account of `chain` (a run and its
/// tenant), updating their kept balances in `chain` and in the working set. Nothing
/// changes when it fails.
pub(crate) fn post(
    ws: &mut WorkSet,
    chain: &mut [AccountRow],
    meta: &TransferMeta<'_>,
    d: Deltas,
) -> Result<String, LedgerError> {
    let balances = balances_after(chain, d)?;
    let now = model::now_ms();
    let transfer_id = format!("tr-{}", uuid::Uuid::new_v4().simple());
    let tenant_id = chain
        .iter()
        .find(|a| a.kind == forkyard_proto::budget::v1::AccountKind::Tenant)
        .map(|a| a.account_id.clone())
        .unwrap_or_default();
    ws.push_transfer(TransferRow {
        transfer_id: transfer_id.clone(),
        kind: meta.kind,
        account_id: chain[0].account_id.clone(),
        reservation_id: meta.reservation_id.to_owned(),
        amount_micros: meta.amount_micros,
        spent_micros: d.spent,
        run_id: meta.run_id.to_owned(),
        fork: meta.fork.to_owned(),
        model: meta.model.to_owned(),
        tenant_id,
        idempotency_key: meta.idempotency_key.to_owned(),
        created_unix_ms: now,
    });
    let legs = [
        (Bucket::Funding, d.funding),
        (Bucket::Available, d.available),
        (Bucket::Reserved, d.reserved),
        (Bucket::Spent, d.spent),
    ];
    for (account, (budget, reserved, spent)) in chain.iter_mut().zip(balances) {
        account.budget_micros = budget;
        account.reserved_micros = reserved;
        account.spent_micros = spent;
        for (bucket, amount) in legs.iter().filter(|(_, a)| *a != 0) {
            account.posting_seq += 1;
            ws.push_posting(PostingRow {
                account_id: account.account_id.clone(),
                seq: account.posting_seq,
                transfer_id: transfer_id.clone(),
                bucket: model::bucket_str(*bucket),
                amount_micros: *amount,
                created_unix_ms: now,
            });
        }
        ws.put_account(account.clone());
    }
    Ok(transfer_id)
}

/// Each account's (budget, reserved, spent) once `d` is posted; refused when the legs do
/// not sum to zero or a balance would overflow.
fn balances_after(chain: &[AccountRow], d: Deltas) -> Result<Vec<(i64, i64, i64)>, LedgerError> {
    let sum = [d.funding, d.available, d.reserved, d.spent]
        .iter()
        .try_fold(0i64, |acc, x| acc.checked_add(*x));
    if sum != Some(0) {
        return Err(LedgerError::Corrupt(format!("unbalanced transfer {d:?}")));
    }
    let overflow = || LedgerError::invalid("amount_micros", "the balance would overflow");
    chain
        .iter()
        .map(|a| {
            Ok((
                a.budget_micros
                    .checked_sub(d.funding)
                    .ok_or_else(overflow)?,
                a.reserved_micros
                    .checked_add(d.reserved)
                    .ok_or_else(overflow)?,
                a.spent_micros.checked_add(d.spent).ok_or_else(overflow)?,
            ))
        })
        .collect()
}

/// Default and largest page of `ListPostings`.
const DEFAULT_PAGE: i64 = 100;
const MAX_PAGE: i64 = 1000;

pub(crate) async fn list(
    conn: &mut AnyConnection,
    req: &ListPostingsRequest,
) -> Result<ListPostingsResponse, LedgerError> {
    let size = match req.page_size {
        0 => DEFAULT_PAGE,
        n if (1..=MAX_PAGE).contains(&i64::from(n)) => i64::from(n),
        n => {
            return Err(LedgerError::invalid(
                "page_size",
                format!("must be between 1 and {MAX_PAGE}, got {n}"),
            ));
        }
    };
    let after: i64 = if req.page_token.is_empty() {
        0
    } else {
        req.page_token
            .parse()
            .ok()
            .filter(|n: &i64| *n >= 0)
            .ok_or_else(|| LedgerError::invalid("page_token", "not a token from ListPostings"))?
    };
    let rows = sqlx::query(
        "SELECT p.account_id, p.seq, p.transfer_id, t.kind, p.bucket, p.amount_micros, \
           t.reservation_id, p.created_unix_ms \
         FROM postings p JOIN transfers t ON t.transfer_id = p.transfer_id \
         WHERE p.account_id = $1 AND p.seq > $2 ORDER BY p.seq LIMIT $3",
    )
    .bind(&req.account_id)
    .bind(after)
    .bind(size + 1)
    .fetch_all(&mut *conn)
    .await?;
    let mut postings = Vec::with_capacity(rows.len());
    for row in rows.iter().take(size as usize) {
        let bucket: String = row.try_get("bucket")?;
        postings.push(Posting {
            account_id: row.try_get("account_id")?,
            seq: row.try_get("seq")?,
            transfer_id: row.try_get("transfer_id")?,
            kind: row.try_get("kind")?,
            bucket: model::parse_bucket(&bucket)? as i32,
            amount_micros: row.try_get("amount_micros")?,
            reservation_id: row.try_get("reservation_id")?,
            created_unix_ms: row.try_get("created_unix_ms")?,
        });
    }
    let next_page_token = match (rows.len() as i64 > size, postings.last()) {
        (true, Some(last)) => last.seq.to_string(),
        _ => String::new(),
    };
    Ok(ListPostingsResponse {
        postings,
        next_page_token,
    })
}

/// Re-derives the ledger from its postings and returns every discrepancy (empty when the
/// books are right): unbalanced transfers, kept balances that differ from the sums of
/// postings, negative available without overdraft, and reservations whose holds do not
/// add up to the account's reserved balance (runs only: tenants mirror their runs).
pub(crate) async fn audit(conn: &mut AnyConnection) -> Result<Vec<String>, LedgerError> {
    let mut problems = Vec::new();
    let unbalanced = sqlx::query(
        "SELECT transfer_id, account_id, CAST(SUM(amount_micros) AS BIGINT) AS total \
         FROM postings GROUP BY transfer_id, account_id HAVING SUM(amount_micros) <> 0",
    )
    .fetch_all(&mut *conn)
    .await?;
    for row in unbalanced {
        let (t, a, s): (String, String, i64) = (row.try_get(0)?, row.try_get(1)?, row.try_get(2)?);
        problems.push(format!("transfer {t} on {a} sums to {s}"));
    }
    let accounts = sqlx::query(
        "SELECT a.account_id, a.kind, a.budget_micros, a.reserved_micros, a.spent_micros, \
           a.allow_overdraft, \
           CAST(COALESCE(SUM(CASE WHEN p.bucket = 'FUNDING' THEN p.amount_micros END), 0) AS BIGINT) AS f, \
           CAST(COALESCE(SUM(CASE WHEN p.bucket = 'AVAILABLE' THEN p.amount_micros END), 0) AS BIGINT) AS av, \
           CAST(COALESCE(SUM(CASE WHEN p.bucket = 'RESERVED' THEN p.amount_micros END), 0) AS BIGINT) AS r, \
           CAST(COALESCE(SUM(CASE WHEN p.bucket = 'SPENT' THEN p.amount_micros END), 0) AS BIGINT) AS s, \
           (SELECT CAST(COALESCE(SUM(CASE WHEN x.amount_micros > x.charged_micros \
               THEN x.amount_micros - x.charged_micros ELSE 0 END), 0) AS BIGINT) \
             FROM reservations x WHERE x.account_id = a.account_id AND x.state = 'HELD') AS holds \
         FROM accounts a LEFT JOIN postings p ON p.account_id = a.account_id \
         GROUP BY a.account_id, a.kind, a.budget_micros, a.reserved_micros, a.spent_micros, a.allow_overdraft",
    )
    .fetch_all(&mut *conn)
    .await?;
    for row in accounts {
        account_problems(&row, &mut problems)?;
    }
    Ok(problems)
}

/// What one row of the audit's account query says is wrong with that account: its kept
/// figures against its postings, its available balance, its reservations.
fn account_problems(
    row: &sqlx::any::AnyRow,
    problems: &mut Vec<String>,
) -> Result<(), LedgerError> {
    let id: String = row.try_get("account_id")?;
    let kind: String = row.try_get("kind")?;
    let (budget, reserved, spent): (i64, i64, i64) = (
        row.try_get("budget_micros")?,
        row.try_get("reserved_micros")?,
        row.try_get("spent_micros")?,
    );
    let overdraft = row.try_get::<i64, _>("allow_overdraft")? != 0;
    let (f, av, r, s, holds): (i64, i64, i64, i64, i64) = (
        row.try_get("f")?,
        row.try_get("av")?,
        row.try_get("r")?,
        row.try_get("s")?,
        row.try_get("holds")?,
    );
    if (-f, r, s) != (budget, reserved, spent) {
        problems.push(format!(
            "{id}: kept (budget {budget}, reserved {reserved}, spent {spent}) but postings say ({}, {r}, {s})",
            -f
        ));
    }
    if av != budget - reserved - spent {
        problems.push(format!(
            "{id}: available postings {av} != budget - reserved - spent"
        ));
    }
    if av < 0 && !overdraft {
        problems.push(format!("{id}: available {av} below zero without overdraft"));
    }
    if kind == "RUN" && holds != reserved {
        problems.push(format!(
            "{id}: reservations hold {holds} but reserved is {reserved}"
        ));
    }
    Ok(())
}
