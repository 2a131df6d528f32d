//! Account operations inside a write transaction: loading and locking accounts with their
//! tenant, creating accounts, raising budgets.

use crate::{
    db::Backend,
    error::LedgerError,
    idempotency,
    model::{self, AccountRow},
    postings::{self, Deltas, TransferMeta},
};
use forkyard_proto::budget::v1::{
    Account, AccountKind, CommitOverage, CreateAccountRequest, RaiseBudgetRequest,
};
use sqlx::AnyConnection;

pub(crate) async fn load(
    conn: &mut AnyConnection,
    backend: Backend,
    account_id: &str,
    lock: bool,
) -> Result<Option<AccountRow>, LedgerError> {
    let sql = if lock {
        format!("{}{}", model::SELECT_ACCOUNT, backend.lock_rows())
    } else {
        model::SELECT_ACCOUNT.to_owned()
    };
    let row = sqlx::query(&sql)
        .bind(account_id)
        .fetch_optional(&mut *conn)
        .await?;
    row.map(|r| AccountRow::from_row(&r)).transpose()
}

pub(crate) async fn require(
    conn: &mut AnyConnection,
    backend: Backend,
    account_id: &str,
    lock: bool,
) -> Result<AccountRow, LedgerError> {
    load(conn, backend, account_id, lock)
        .await?
        .ok_or_else(|| LedgerError::NotFound(format!("account {account_id:?} not found")))
}

/// The account and, for a run with a tenant, the tenant after it; both locked until the
/// transaction ends. Tenants are locked before their runs, so lock order is fixed.
pub(crate) async fn lock_chain(
    conn: &mut AnyConnection,
    backend: Backend,
    account_id: &str,
) -> Result<Vec<AccountRow>, LedgerError> {
    let first = require(conn, backend, account_id, backend == Backend::Sqlite).await?;
    if first.parent_account_id.is_empty() {
        if backend == Backend::Sqlite {
            return Ok(vec![first]);
        }
        return Ok(vec![require(conn, backend, account_id, true).await?]);
    }
    let parent = require(conn, backend, &first.parent_account_id, true).await?;
    let account = if backend == Backend::Sqlite {
        first
    } else {
        require(conn, backend, account_id, true).await?
    };
    Ok(vec![account, parent])
}

/// `CreateAccountRequest` with its kind and overage normalised and its labels sorted, as
/// the fingerprint of the request.
pub(crate) fn create_fingerprint(req: &CreateAccountRequest) -> Result<String, LedgerError> {
    let labels: std::collections::BTreeMap<_, _> = req.labels.iter().collect();
    idempotency::fingerprint(&(
        &req.account_id,
        model::kind_str(req.kind()),
        &req.parent_account_id,
        req.budget_micros,
        req.allow_overdraft,
        model::overage_str(req.commit_overage()),
        labels,
    ))
}

/// Creates the account (or returns it when it exists with the same parameters), funding
/// its budget with one transfer. `op` and `fp` key the call (`open_account` keeps its own).
pub(crate) async fn create(
    conn: &mut AnyConnection,
    backend: Backend,
    req: &CreateAccountRequest,
    op: &str,
    fp: &str,
) -> Result<Account, LedgerError> {
    if let Some(resp) = idempotency::replay(conn, op, &req.idempotency_key, fp).await? {
        return Ok(resp);
    }
    let kind = match req.kind() {
        AccountKind::Tenant => AccountKind::Tenant,
        _ => AccountKind::Run,
    };
    if !req.parent_account_id.is_empty() {
        let parent = require(conn, backend, &req.parent_account_id, true)
            .await
            .map_err(|e| match e {
                LedgerError::NotFound(m) => {
                    LedgerError::NotFound(format!("parent_account_id: {m}"))
                }
                other => other,
            })?;
        if parent.kind != AccountKind::Tenant {
            return Err(LedgerError::FailedPrecondition(format!(
                "parent_account_id: account {:?} is not a tenant account",
                parent.account_id
            )));
        }
    }
    let wanted = AccountRow {
        account_id: req.account_id.clone(),
        kind,
        parent_account_id: req.parent_account_id.clone(),
        budget_micros: req.budget_micros,
        reserved_micros: 0,
        spent_micros: 0,
        allow_overdraft: req.allow_overdraft,
        commit_overage: match req.commit_overage() {
            CommitOverage::Reject => CommitOverage::Reject,
            _ => CommitOverage::Cap,
        },
        labels: req.labels.clone().into_iter().collect(),
        posting_seq: 0,
        created_unix_ms: model::now_ms(),
    };
    let account = match load(conn, backend, &req.account_id, true).await? {
        Some(existing) => {
            let same = existing.kind == wanted.kind
                && existing.parent_account_id == wanted.parent_account_id
                && existing.budget_micros == wanted.budget_micros
                && existing.allow_overdraft == wanted.allow_overdraft
                && existing.commit_overage == wanted.commit_overage
                && existing.labels == wanted.labels;
            if !same {
                return Err(LedgerError::AlreadyExists(format!(
                    "account {:?} already exists with budget {} micros (requested {}) or other parameters",
                    req.account_id, existing.budget_micros, req.budget_micros
                )));
            }
            existing.to_proto()
        }
        None => {
            let labels = serde_json::to_string(&wanted.labels)
                .map_err(|e| LedgerError::Corrupt(format!("labels: {e}")))?;
            sqlx::query(
                "INSERT INTO accounts (account_id, budget_micros, created_unix_ms, kind, \
                 parent_account_id, allow_overdraft, commit_overage, labels) \
                 VALUES ($1, 0, $2, $3, $4, $5, $6, $7)",
            )
            .bind(&wanted.account_id)
            .bind(wanted.created_unix_ms)
            .bind(model::kind_str(wanted.kind))
            .bind(&wanted.parent_account_id)
            .bind(i64::from(wanted.allow_overdraft))
            .bind(model::overage_str(wanted.commit_overage))
            .bind(labels)
            .execute(&mut *conn)
            .await?;
            let mut chain = vec![AccountRow {
                budget_micros: 0,
                ..wanted
            }];
            if req.budget_micros > 0 {
                fund(conn, &mut chain, req.budget_micros, &req.idempotency_key).await?;
            }
            chain.remove(0).to_proto()
        }
    };
    idempotency::remember(conn, op, &req.idempotency_key, fp, &account).await?;
    Ok(account)
}

/// Adds to the budget of the first account of `chain` (a run's tenant is not funded by
/// its run: the run's budget is its own cap within the tenant's).
async fn fund(
    conn: &mut AnyConnection,
    chain: &mut [AccountRow],
    amount: i64,
    key: &str,
) -> Result<(), LedgerError> {
    let meta = TransferMeta {
        kind: "FUND",
        amount_micros: amount,
        idempotency_key: key,
        ..Default::default()
    };
    let deltas = Deltas {
        funding: -amount,
        available: amount,
        ..Default::default()
    };
    postings::post(conn, &mut chain[..1], &meta, deltas).await?;
    Ok(())
}

pub(crate) async fn raise_budget(
    conn: &mut AnyConnection,
    backend: Backend,
    req: &RaiseBudgetRequest,
) -> Result<Account, LedgerError> {
    let op = "raise_budget";
    let fp = idempotency::fingerprint(&RaiseBudgetRequest {
        idempotency_key: String::new(),
        ..req.clone()
    })?;
    if let Some(resp) = idempotency::replay(conn, op, &req.idempotency_key, &fp).await? {
        return Ok(resp);
    }
    let mut chain = vec![require(conn, backend, &req.account_id, true).await?];
    if chain[0]
        .budget_micros
        .checked_add(req.amount_micros)
        .is_none_or(|b| b > model::MAX_AMOUNT_MICROS * 1000)
    {
        return Err(LedgerError::invalid(
            "amount_micros",
            format!(
                "raising {} by {} overflows",
                chain[0].budget_micros, req.amount_micros
            ),
        ));
    }
    fund(conn, &mut chain, req.amount_micros, &req.idempotency_key).await?;
    let account = chain[0].to_proto();
    idempotency::remember(conn, op, &req.idempotency_key, &fp, &account).await?;
    Ok(account)
}
