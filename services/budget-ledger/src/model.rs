//! Stored rows, their protobuf forms, and the ledger's arithmetic.

use crate::error::LedgerError;
use forkyard_proto::budget::v1::{
    Account, AccountKind, Bucket, CommitOverage, Reservation, ReservationState,
};
use sqlx::{Row, any::AnyRow};
use std::collections::BTreeMap;

/// The largest amount one request may carry: 10^15 micro-USD (a billion dollars), so sums
/// of many postings stay far from `i64` overflow.
pub const MAX_AMOUNT_MICROS: i64 = 1_000_000_000_000_000;

pub(crate) const SELECT_ACCOUNTS: &str = "\
    SELECT account_id, kind, parent_account_id, budget_micros, reserved_micros, spent_micros, \
      allow_overdraft, commit_overage, labels, posting_seq, created_unix_ms \
    FROM accounts";

pub(crate) const SELECT_ACCOUNT: &str = "\
    SELECT account_id, kind, parent_account_id, budget_micros, reserved_micros, spent_micros, \
      allow_overdraft, commit_overage, labels, posting_seq, created_unix_ms \
    FROM accounts WHERE account_id = $1";

pub(crate) const SELECT_RESERVATION: &str = "\
    SELECT reservation_id, account_id, amount_micros, state, committed_micros, budget_exceeded, \
      holder, created_unix_ms, charged_micros FROM reservations";

pub(crate) use forkyard_common::clock::now_ms;

pub(crate) fn state_str(state: ReservationState) -> &'static str {
    match state {
        ReservationState::Held => "HELD",
        ReservationState::Committed => "COMMITTED",
        ReservationState::Released => "RELEASED",
        ReservationState::Unspecified => "UNSPECIFIED",
    }
}

fn parse_state(s: &str) -> Result<ReservationState, LedgerError> {
    match s {
        "HELD" => Ok(ReservationState::Held),
        "COMMITTED" => Ok(ReservationState::Committed),
        "RELEASED" => Ok(ReservationState::Released),
        other => Err(LedgerError::Corrupt(format!(
            "unknown reservation state {other:?}"
        ))),
    }
}

pub(crate) fn kind_str(kind: AccountKind) -> &'static str {
    match kind {
        AccountKind::Tenant => "TENANT",
        AccountKind::Run | AccountKind::Unspecified => "RUN",
    }
}

pub(crate) fn overage_str(o: CommitOverage) -> &'static str {
    match o {
        CommitOverage::Reject => "REJECT",
        CommitOverage::Cap | CommitOverage::Unspecified => "CAP",
    }
}

pub(crate) fn bucket_str(b: Bucket) -> &'static str {
    match b {
        Bucket::Funding => "FUNDING",
        Bucket::Available => "AVAILABLE",
        Bucket::Reserved => "RESERVED",
        Bucket::Spent | Bucket::Unspecified => "SPENT",
    }
}

pub(crate) fn parse_bucket(s: &str) -> Result<Bucket, LedgerError> {
    Ok(match s {
        "FUNDING" => Bucket::Funding,
        "AVAILABLE" => Bucket::Available,
        "RESERVED" => Bucket::Reserved,
        "SPENT" => Bucket::Spent,
        other => return Err(LedgerError::Corrupt(format!("unknown bucket {other:?}"))),
    })
}

/// An account as stored, balances included.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct AccountRow {
    pub account_id: String,
    pub kind: AccountKind,
    pub parent_account_id: String,
    pub budget_micros: i64,
    pub reserved_micros: i64,
    pub spent_micros: i64,
    pub allow_overdraft: bool,
    pub commit_overage: CommitOverage,
    pub labels: BTreeMap<String, String>,
    pub posting_seq: i64,
    pub created_unix_ms: i64,
}

impl AccountRow {
    pub(crate) fn from_row(row: &AnyRow) -> Result<Self, LedgerError> {
        let kind: String = row.try_get("kind")?;
        let overage: String = row.try_get("commit_overage")?;
        let labels: String = row.try_get("labels")?;
        Ok(Self {
            account_id: row.try_get("account_id")?,
            kind: if kind == "TENANT" {
                AccountKind::Tenant
            } else {
                AccountKind::Run
            },
            parent_account_id: row.try_get("parent_account_id")?,
            budget_micros: row.try_get("budget_micros")?,
            reserved_micros: row.try_get("reserved_micros")?,
            spent_micros: row.try_get("spent_micros")?,
            allow_overdraft: row.try_get::<i64, _>("allow_overdraft")? != 0,
            commit_overage: if overage == "REJECT" {
                CommitOverage::Reject
            } else {
                CommitOverage::Cap
            },
            labels: serde_json::from_str(&labels)
                .map_err(|e| LedgerError::Corrupt(format!("labels {labels:?}: {e}")))?,
            posting_seq: row.try_get("posting_seq")?,
            created_unix_ms: row.try_get("created_unix_ms")?,
        })
    }

    /// budget - reserved - spent.
    pub(crate) fn available(&self) -> i64 {
        self.budget_micros - self.reserved_micros - self.spent_micros
    }

    /// How much more this account can move out of available; `None` = unlimited.
    pub(crate) fn headroom(&self) -> Option<i64> {
        (!self.allow_overdraft).then(|| self.available().max(0))
    }

    pub(crate) fn to_proto(&self) -> Account {
        Account {
            account_id: self.account_id.clone(),
            budget_micros: self.budget_micros,
            reserved_micros: self.reserved_micros,
            spent_micros: self.spent_micros,
            available_micros: self.available(),
            created_unix_ms: self.created_unix_ms,
            kind: self.kind as i32,
            parent_account_id: self.parent_account_id.clone(),
            allow_overdraft: self.allow_overdraft,
            labels: self.labels.clone().into_iter().collect(),
            commit_overage: self.commit_overage as i32,
        }
    }
}

/// The smallest headroom along a chain of accounts (a run and its tenant).
pub(crate) fn chain_headroom(chain: &[AccountRow]) -> Option<i64> {
    chain.iter().filter_map(AccountRow::headroom).min()
}

/// A reservation as stored, with its state typed.
#[derive(Debug, Clone)]
pub(crate) struct ReservationRow {
    pub reservation_id: String,
    pub account_id: String,
    pub amount_micros: i64,
    pub state: ReservationState,
    pub committed_micros: i64,
    pub budget_exceeded: bool,
    pub holder: String,
    pub created_unix_ms: i64,
    pub charged_micros: i64,
}

impl ReservationRow {
    pub(crate) fn from_row(row: &AnyRow) -> Result<Self, LedgerError> {
        let state: String = row.try_get("state")?;
        let exceeded: i64 = row.try_get("budget_exceeded")?;
        Ok(Self {
            reservation_id: row.try_get("reservation_id")?,
            account_id: row.try_get("account_id")?,
            amount_micros: row.try_get("amount_micros")?,
            state: parse_state(&state)?,
            committed_micros: row.try_get("committed_micros")?,
            budget_exceeded: exceeded != 0,
            holder: row.try_get("holder")?,
            created_unix_ms: row.try_get("created_unix_ms")?,
            charged_micros: row.try_get("charged_micros")?,
        })
    }

    /// What the reservation still holds in RESERVED.
    pub(crate) fn held(&self) -> i64 {
        if self.state == ReservationState::Held {
            (self.amount_micros - self.charged_micros).max(0)
        } else {
            0
        }
    }

    pub(crate) fn into_proto(self) -> Reservation {
        Reservation {
            reservation_id: self.reservation_id,
            account_id: self.account_id,
            amount_micros: self.amount_micros,
            state: self.state as i32,
            committed_micros: self.committed_micros,
            budget_exceeded: self.budget_exceeded,
            holder: self.holder,
            created_unix_ms: self.created_unix_ms,
            charged_micros: self.charged_micros,
        }
    }
}

/// How a spend of `amount` against a reservation holding `held` splits: the part taken
/// from the hold and the part beyond it (which must come from available).
pub(crate) fn split_spend(amount: i64, held: i64) -> (i64, i64) {
    let from_hold = amount.min(held);
    (from_hold, amount - from_hold)
}

/// What a capped commit may take beyond the hold: `extra`, at most `headroom`. Returns the
/// amount taken and whether it had to be capped.
pub(crate) fn cap_extra(extra: i64, headroom: Option<i64>) -> (i64, bool) {
    match headroom {
        Some(h) if extra > h => (h, true),
        _ => (extra, false),
    }
}

#[cfg(test)]
mod tests {
    use super::{cap_extra, split_spend};

    #[test]
    fn commit_cap_table() {
        // (requested, reserved, available) -> (committed, exceeded), as before postings.
        let cases = [
            ((0, 100, 0), (0, false)),
            ((50, 100, 0), (50, false)),
            ((100, 100, 0), (100, false)),
            ((150, 100, 100), (150, false)),
            ((200, 100, 100), (200, false)),
            ((250, 100, 100), (200, true)),
            ((250, 100, 0), (100, true)),
        ];
        for ((req, rsv, avail), want) in cases {
            let (hold, extra) = split_spend(req, rsv);
            let (extra, capped) = cap_extra(extra, Some(avail));
            assert_eq!(
                (hold + extra, capped),
                want,
                "commit {req} of {rsv} with {avail}"
            );
        }
        assert_eq!(cap_extra(500, None), (500, false));
    }
}
