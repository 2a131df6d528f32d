//! Rows to protobuf messages, and the ledger's arithmetic.

use crate::error::LedgerError;
use forkyard_proto::budget::v1::{Account, Reservation, ReservationState};
use sqlx::{Row, sqlite::SqliteRow};

/// An account with its balances: reserved = sum of HELD reservations, spent = sum of
/// committed amounts. `CAST` keeps the sums BIGINT on PostgreSQL too.
pub(crate) const SELECT_ACCOUNT: &str = "\
    SELECT a.account_id, a.budget_micros, a.created_unix_ms, \
      CAST(COALESCE(SUM(CASE WHEN r.state = 'HELD' THEN r.amount_micros ELSE 0 END), 0) AS BIGINT) AS reserved_micros, \
      CAST(COALESCE(SUM(CASE WHEN r.state = 'COMMITTED' THEN r.committed_micros ELSE 0 END), 0) AS BIGINT) AS spent_micros \
    FROM accounts a LEFT JOIN reservations r ON r.account_id = a.account_id \
    WHERE a.account_id = $1 \
    GROUP BY a.account_id, a.budget_micros, a.created_unix_ms";

pub(crate) const SELECT_RESERVATION: &str = "\
    SELECT reservation_id, account_id, amount_micros, state, committed_micros, budget_exceeded, \
      holder, created_unix_ms FROM reservations";

pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

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

pub(crate) fn account_from_row(row: &SqliteRow) -> Result<Account, LedgerError> {
    let budget: i64 = row.try_get("budget_micros")?;
    let reserved: i64 = row.try_get("reserved_micros")?;
    let spent: i64 = row.try_get("spent_micros")?;
    Ok(Account {
        account_id: row.try_get("account_id")?,
        budget_micros: budget,
        reserved_micros: reserved,
        spent_micros: spent,
        available_micros: budget - reserved - spent,
        created_unix_ms: row.try_get("created_unix_ms")?,
    })
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
}

impl ReservationRow {
    pub(crate) fn from_row(row: &SqliteRow) -> Result<Self, LedgerError> {
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
        })
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
        }
    }
}

/// What a commit of `requested` against a HELD reservation of `reserved` may post, given
/// what the account has left besides it (`available`): at most `reserved + available`.
/// Returns the amount committed and whether the request had to be capped.
pub(crate) fn cap_commit(requested: i64, reserved: i64, available: i64) -> (i64, bool) {
    let cap = reserved.saturating_add(available.max(0));
    if requested > cap {
        (cap, true)
    } else {
        (requested, false)
    }
}

#[cfg(test)]
mod tests {
    use super::cap_commit;

    #[test]
    fn commit_cap_table() {
        // (requested, reserved, available) -> (committed, exceeded)
        let cases = [
            ((0, 100, 0), (0, false)),
            ((50, 100, 0), (50, false)),
            ((100, 100, 0), (100, false)),
            ((150, 100, 100), (150, false)),
            ((200, 100, 100), (200, false)),
            ((250, 100, 100), (200, true)),
            ((250, 100, 0), (100, true)),
            ((250, 100, -5), (100, true)),
        ];
        for ((req, rsv, avail), want) in cases {
            assert_eq!(
                cap_commit(req, rsv, avail),
                want,
                "cap_commit({req}, {rsv}, {avail})"
            );
        }
    }
}
