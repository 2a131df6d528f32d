//! Account operations: reading an account, and (in a batch's [`WorkSet`]) creating
//! accounts and raising budgets.

use crate::{
    error::LedgerError,
    idempotency,
    model::{self, AccountRow},
    postings::{self, Deltas, TransferMeta},
    workset::WorkSet,
};
use forkyard_proto::budget::v1::{
    Account, AccountKind, CommitOverage, CreateAccountRequest, RaiseBudgetRequest,
};
use sqlx::AnyConnection;

/// The account as committed (outside the writer).
pub(crate) async fn require(
    conn: &mut AnyConnection,
    account_id: &str,
) -> Result<AccountRow, LedgerError> {
    let row = sqlx::query(model::SELECT_ACCOUNT)
        .bind(account_id)
        .fetch_optional(&mut *conn)
        .await?;
    row.map(|r| AccountRow::from_row(&r))
        .transpose()?
        .ok_or_else(|| LedgerError::NotFound(format!("account {account_id:?} not found")))
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
pub(crate) fn create(
    ws: &mut WorkSet,
    req: &CreateAccountRequest,
    op: &str,
    fp: &str,
) -> Result<Account, LedgerError> {
    if let Some(resp) = idempotency::replay(ws, op, &req.idempotency_key, fp)? {
        return Ok(resp);
    }
    let kind = match req.kind() {
        AccountKind::Tenant => AccountKind::Tenant,
        _ => AccountKind::Run,
    };
    check_parent(ws, &req.parent_account_id)?;
    let wanted = wanted_row(req, kind);
    let account = match ws.account(&req.account_id) {
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
            let mut chain = vec![AccountRow {
                budget_micros: 0,
                ..wanted
            }];
            ws.put_account(chain[0].clone());
            if req.budget_micros > 0 {
                fund(ws, &mut chain, req.budget_micros, &req.idempotency_key)?;
            }
            chain.remove(0).to_proto()
        }
    };
    idempotency::remember(ws, op, &req.idempotency_key, fp, &account)?;
    Ok(account)
}

/// A parent, when named, must be a tenant account that exists.
fn check_parent(ws: &WorkSet, parent_account_id: &str) -> Result<(), LedgerError> {
    if parent_account_id.is_empty() {
        return Ok(());
    }
    let parent = ws.require_account(parent_account_id).map_err(|e| match e {
        LedgerError::NotFound(m) => LedgerError::NotFound(format!("parent_account_id: {m}")),
        other => other,
    })?;
    if parent.kind != AccountKind::Tenant {
        return Err(LedgerError::FailedPrecondition(format!(
            "parent_account_id: account {:?} is not a tenant account",
            parent.account_id
        )));
    }
    Ok(())
}

/// The account the request asks for, nothing reserved or spent yet.
fn wanted_row(req: &CreateAccountRequest, kind: AccountKind) -> AccountRow {
    AccountRow {
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
    }
}

/// Adds to the budget of the first account of `chain` (a run's tenant is not funded by
/// its run: the run's budget is its own cap within the tenant's).
fn fund(
    ws: &mut WorkSet,
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
    postings::post(ws, &mut chain[..1], &meta, deltas)?;
    Ok(())
}

pub(crate) fn raise_budget(
    ws: &mut WorkSet,
    req: &RaiseBudgetRequest,
) -> Result<Account, LedgerError> {
    let op = "raise_budget";
    let fp = idempotency::fingerprint(&RaiseBudgetRequest {
        idempotency_key: String::new(),
        ..req.clone()
    })?;
    if let Some(resp) = idempotency::replay(ws, op, &req.idempotency_key, &fp)? {
        return Ok(resp);
    }
    let mut chain = vec![ws.require_account(&req.account_id)?];
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
    fund(ws, &mut chain, req.amount_micros, &req.idempotency_key)?;
    let account = chain[0].to_proto();
    idempotency::remember(ws, op, &req.idempotency_key, &fp, &account)?;
    Ok(account)
}
