//! Writing a batch's working set at the end of its transaction, as multi-row statements
//! for the whole batch: accounts and reservations upserted with their new balances and
//! states, then the new transfers, their postings and the idempotency keys (in foreign
//! key order).

use crate::{
    db::Backend,
    error::LedgerError,
    model::{self, AccountRow, ReservationRow},
    workset::{PostingRow, StoredKey, TransferRow, WorkSet},
};
use sqlx::{Any, AnyConnection, any::AnyArguments, query::Query};

/// Most rows of one statement. Chunks are powers of two, so that only a few statement
/// shapes get prepared and cached.
const MAX_ROWS: usize = 256;

type AnyQuery<'q> = Query<'q, Any, AnyArguments<'q>>;

/// A row of one of the tables the writer inserts into.
trait WriteRow {
    const COLS: usize;
    fn bind<'q>(&'q self, q: AnyQuery<'q>) -> AnyQuery<'q>;
}

pub(crate) async fn flush(
    conn: &mut AnyConnection,
    backend: Backend,
    ws: &WorkSet,
) -> Result<(), LedgerError> {
    let accounts = ws.dirty_accounts();
    let labels = accounts
        .iter()
        .map(|a| serde_json::to_string(&a.labels))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| LedgerError::Corrupt(format!("labels: {e}")))?;
    let accounts: Vec<AccountOut<'_>> = accounts.into_iter().zip(labels).collect();
    insert(
        conn,
        backend,
        "INSERT INTO accounts (account_id, kind, parent_account_id, budget_micros, \
         reserved_micros, spent_micros, allow_overdraft, commit_overage, labels, posting_seq, \
         created_unix_ms)",
        "ON CONFLICT (account_id) DO UPDATE SET budget_micros = excluded.budget_micros, \
         reserved_micros = excluded.reserved_micros, spent_micros = excluded.spent_micros, \
         posting_seq = excluded.posting_seq",
        &accounts,
    )
    .await?;
    insert(
        conn,
        backend,
        "INSERT INTO reservations (reservation_id, account_id, amount_micros, state, \
         committed_micros, budget_exceeded, holder, created_unix_ms, charged_micros)",
        "ON CONFLICT (reservation_id) DO UPDATE SET state = excluded.state, \
         committed_micros = excluded.committed_micros, \
         budget_exceeded = excluded.budget_exceeded, charged_micros = excluded.charged_micros",
        &ws.dirty_reservations(),
    )
    .await?;
    insert(
        conn,
        backend,
        "INSERT INTO transfers (transfer_id, kind, account_id, reservation_id, amount_micros, \
         spent_micros, run_id, fork, model, tenant_id, idempotency_key, created_unix_ms)",
        "",
        &ws.transfers().iter().collect::<Vec<_>>(),
    )
    .await?;
    insert(
        conn,
        backend,
        "INSERT INTO postings (account_id, seq, transfer_id, bucket, amount_micros, \
         created_unix_ms)",
        "",
        &ws.postings().iter().collect::<Vec<_>>(),
    )
    .await?;
    let keys = ws.new_keys();
    insert(
        conn,
        backend,
        "INSERT INTO idempotency_keys (idempotency_key, operation, fingerprint, response, \
         created_unix_ms)",
        "",
        &keys,
    )
    .await?;
    Ok(())
}

/// `{head} VALUES (…), (…) {tail}` for `rows`, in chunks of powers of two.
async fn insert<T: WriteRow>(
    conn: &mut AnyConnection,
    backend: Backend,
    head: &str,
    tail: &str,
    rows: &[T],
) -> Result<(), LedgerError> {
    let mut rest = rows;
    while !rest.is_empty() {
        let n = 1 << rest.len().min(MAX_ROWS).ilog2();
        let (chunk, more) = rest.split_at(n);
        let sql = format!("{head} VALUES {} {tail}", placeholders(backend, T::COLS, n));
        let mut q = sqlx::query(&sql);
        for row in chunk {
            q = row.bind(q);
        }
        q.execute(&mut *conn).await?;
        rest = more;
    }
    Ok(())
}

/// `($1, …, $cols), ($cols+1, …), …` for `rows` rows.
fn placeholders(backend: Backend, cols: usize, rows: usize) -> String {
    let mut s = String::with_capacity(rows * cols * 6);
    for r in 0..rows {
        if r > 0 {
            s.push_str(", ");
        }
        s.push('(');
        for c in 0..cols {
            if c > 0 {
                s.push_str(", ");
            }
            backend.push_param(&mut s, r * cols + c + 1);
        }
        s.push(')');
    }
    s
}

/// An account with its labels as JSON.
type AccountOut<'a> = (&'a AccountRow, String);

impl WriteRow for AccountOut<'_> {
    const COLS: usize = 11;
    fn bind<'q>(&'q self, q: AnyQuery<'q>) -> AnyQuery<'q> {
        let (a, labels) = self;
        q.bind(a.account_id.as_str())
            .bind(model::kind_str(a.kind))
            .bind(a.parent_account_id.as_str())
            .bind(a.budget_micros)
            .bind(a.reserved_micros)
            .bind(a.spent_micros)
            .bind(i64::from(a.allow_overdraft))
            .bind(model::overage_str(a.commit_overage))
            .bind(labels.as_str())
            .bind(a.posting_seq)
            .bind(a.created_unix_ms)
    }
}

impl WriteRow for &ReservationRow {
    const COLS: usize = 9;
    fn bind<'q>(&'q self, q: AnyQuery<'q>) -> AnyQuery<'q> {
        q.bind(self.reservation_id.as_str())
            .bind(self.account_id.as_str())
            .bind(self.amount_micros)
            .bind(model::state_str(self.state))
            .bind(self.committed_micros)
            .bind(i64::from(self.budget_exceeded))
            .bind(self.holder.as_str())
            .bind(self.created_unix_ms)
            .bind(self.charged_micros)
    }
}

impl WriteRow for &TransferRow {
    const COLS: usize = 12;
    fn bind<'q>(&'q self, q: AnyQuery<'q>) -> AnyQuery<'q> {
        q.bind(self.transfer_id.as_str())
            .bind(self.kind)
            .bind(self.account_id.as_str())
            .bind(self.reservation_id.as_str())
            .bind(self.amount_micros)
            .bind(self.spent_micros)
            .bind(self.run_id.as_str())
            .bind(self.fork.as_str())
            .bind(self.model.as_str())
            .bind(self.tenant_id.as_str())
            .bind(self.idempotency_key.as_str())
            .bind(self.created_unix_ms)
    }
}

impl WriteRow for &PostingRow {
    const COLS: usize = 6;
    fn bind<'q>(&'q self, q: AnyQuery<'q>) -> AnyQuery<'q> {
        q.bind(self.account_id.as_str())
            .bind(self.seq)
            .bind(self.transfer_id.as_str())
            .bind(self.bucket)
            .bind(self.amount_micros)
            .bind(self.created_unix_ms)
    }
}

impl WriteRow for (&str, &StoredKey) {
    const COLS: usize = 5;
    fn bind<'q>(&'q self, q: AnyQuery<'q>) -> AnyQuery<'q> {
        let (key, k) = *self;
        q.bind(key)
            .bind(k.operation.as_str())
            .bind(k.fingerprint.as_str())
            .bind(k.response.as_str())
            .bind(k.created_unix_ms)
    }
}
