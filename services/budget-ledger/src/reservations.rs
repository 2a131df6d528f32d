//! Reservation operations in a batch's [`WorkSet`]: reserve, charge, commit, release.
//! Each posts one balanced transfer on the run and (mirrored) on its tenant.

use crate::{
    error::LedgerError,
    idempotency,
    model::{self, AccountRow, ReservationRow},
    postings::{self, Deltas, TransferMeta},
    workset::WorkSet,
};
use forkyard_proto::budget::v1::{
    AccountKind, ChargeRequest, CommitOverage, CommitRequest, ReleaseRequest, Reservation,
    ReservationState, ReserveRequest,
};
use serde::Serialize;
use sqlx::AnyConnection;

fn exceeded(chain: &[AccountRow], what: &str, amount: i64) -> LedgerError {
    let tight = chain
        .iter()
        .filter(|a| !a.allow_overdraft)
        .min_by_key(|a| a.available())
        .unwrap_or(&chain[0]);
    LedgerError::BudgetExceeded(format!(
        "account {:?}: {what} {amount} micros but only {} available (budget {}, reserved {}, spent {})",
        tight.account_id,
        tight.available().max(0),
        tight.budget_micros,
        tight.reserved_micros,
        tight.spent_micros
    ))
}

pub(crate) fn reserve(ws: &mut WorkSet, req: &ReserveRequest) -> Result<Reservation, LedgerError> {
    let (op, key) = ("reserve", req.idempotency_key.as_str());
    let fp = idempotency::fingerprint(&ReserveRequest {
        idempotency_key: String::new(),
        ..req.clone()
    })?;
    if let Some(resp) = idempotency::replay(ws, op, key, &fp)? {
        return Ok(resp);
    }
    let mut chain = ws.chain(&req.account_id)?;
    if model::chain_headroom(&chain).is_some_and(|h| req.amount_micros > h) {
        return Err(exceeded(&chain, "reserving", req.amount_micros));
    }
    let rsv = ReservationRow {
        reservation_id: format!("rsv-{}", uuid::Uuid::new_v4().simple()),
        account_id: req.account_id.clone(),
        amount_micros: req.amount_micros,
        state: ReservationState::Held,
        committed_micros: 0,
        budget_exceeded: false,
        holder: req.holder.clone(),
        created_unix_ms: model::now_ms(),
        charged_micros: 0,
    };
    ws.put_reservation(rsv.clone());
    let run = run_of(&chain);
    let meta = TransferMeta {
        kind: "RESERVE",
        reservation_id: &rsv.reservation_id,
        amount_micros: req.amount_micros,
        run_id: &run,
        fork: &req.holder,
        idempotency_key: key,
        ..Default::default()
    };
    let d = Deltas {
        available: -req.amount_micros,
        reserved: req.amount_micros,
        ..Default::default()
    };
    postings::post(ws, &mut chain, &meta, d)?;
    let resp = rsv.into_proto();
    idempotency::remember(ws, op, key, &fp, &resp)?;
    Ok(resp)
}

fn run_of(chain: &[AccountRow]) -> String {
    if chain[0].kind == AccountKind::Run {
        chain[0].account_id.clone()
    } else {
        String::new()
    }
}

/// A reservation-based call after its key check: the reservation (HELD) and its locked
/// account chain, or the replayed response.
enum Loaded {
    Replay(Reservation),
    Held(ReservationRow, Vec<AccountRow>),
}

fn load_held(
    ws: &WorkSet,
    reservation_id: &str,
    op: &str,
    key: &str,
    fp: &str,
    verb: &str,
) -> Result<Loaded, LedgerError> {
    if let Some(resp) = idempotency::replay(ws, op, key, fp)? {
        return Ok(Loaded::Replay(resp));
    }
    let rsv = ws.reservation(reservation_id)?;
    let chain = ws.chain(&rsv.account_id)?;
    if rsv.state != ReservationState::Held {
        return Err(LedgerError::FailedPrecondition(format!(
            "reservation {} is {}, not HELD: it cannot be {verb}",
            rsv.reservation_id,
            model::state_str(rsv.state)
        )));
    }
    Ok(Loaded::Held(rsv, chain))
}

fn fp_without_key<T: Serialize + Clone>(
    req: &T,
    blank: impl FnOnce(&mut T),
) -> Result<String, LedgerError> {
    let mut r = req.clone();
    blank(&mut r);
    idempotency::fingerprint(&r)
}

pub(crate) fn charge(ws: &mut WorkSet, req: &ChargeRequest) -> Result<Reservation, LedgerError> {
    let (op, key) = ("charge", req.idempotency_key.as_str());
    let fp = fp_without_key(req, |r| r.idempotency_key.clear())?;
    let (mut rsv, mut chain) = match load_held(ws, &req.reservation_id, op, key, &fp, "charged")? {
        Loaded::Replay(r) => return Ok(r),
        Loaded::Held(r, c) => (r, c),
    };
    let (from_hold, extra) = model::split_spend(req.amount_micros, rsv.held());
    if extra > 0 && model::chain_headroom(&chain).is_some_and(|h| extra > h) {
        return Err(exceeded(&chain, "charging beyond the reservation", extra));
    }
    rsv.charged_micros = rsv
        .charged_micros
        .checked_add(req.amount_micros)
        .filter(|c| *c <= model::MAX_AMOUNT_MICROS)
        .ok_or_else(|| {
            LedgerError::invalid("amount_micros", "the reservation's charges overflow")
        })?;
    ws.put_reservation(rsv.clone());
    let attr = req.attribution.clone().unwrap_or_default();
    let run = if attr.run_id.is_empty() {
        run_of(&chain)
    } else {
        attr.run_id
    };
    let fork = if attr.fork.is_empty() {
        rsv.holder.clone()
    } else {
        attr.fork
    };
    let meta = TransferMeta {
        kind: "CHARGE",
        reservation_id: &rsv.reservation_id,
        amount_micros: req.amount_micros,
        run_id: &run,
        fork: &fork,
        model: &attr.model,
        idempotency_key: key,
    };
    let d = Deltas {
        reserved: -from_hold,
        available: -extra,
        spent: req.amount_micros,
        ..Default::default()
    };
    postings::post(ws, &mut chain, &meta, d)?;
    let resp = rsv.into_proto();
    idempotency::remember(ws, op, key, &fp, &resp)?;
    Ok(resp)
}

pub(crate) fn commit(ws: &mut WorkSet, req: &CommitRequest) -> Result<Reservation, LedgerError> {
    let (op, key) = ("commit", req.idempotency_key.as_str());
    let fp = fp_without_key(req, |r| r.idempotency_key.clear())?;
    let (mut rsv, mut chain) =
        match load_held(ws, &req.reservation_id, op, key, &fp, "committed (again)")? {
            Loaded::Replay(r) => return Ok(r),
            Loaded::Held(r, c) => (r, c),
        };
    if req.amount_micros < rsv.charged_micros {
        return Err(LedgerError::FailedPrecondition(format!(
            "amount_micros: committing {} but {} was already charged to reservation {}",
            req.amount_micros, rsv.charged_micros, rsv.reservation_id
        )));
    }
    let held = rsv.held();
    let (from_hold, extra) = model::split_spend(req.amount_micros - rsv.charged_micros, held);
    let (extra, capped) = match chain[0].commit_overage {
        CommitOverage::Reject if extra > 0 => {
            return Err(LedgerError::BudgetExceeded(format!(
                "committing {} micros on reservation {} of {} (charged {}): account {:?} refuses commits above the reservation",
                req.amount_micros,
                rsv.reservation_id,
                rsv.amount_micros,
                rsv.charged_micros,
                rsv.account_id
            )));
        }
        _ => model::cap_extra(extra, model::chain_headroom(&chain)),
    };
    let run = run_of(&chain);
    let meta = TransferMeta {
        kind: "COMMIT",
        reservation_id: &rsv.reservation_id,
        amount_micros: req.amount_micros,
        run_id: &run,
        fork: &rsv.holder,
        idempotency_key: key,
        ..Default::default()
    };
    let d = Deltas {
        reserved: -held,
        spent: from_hold + extra,
        available: held - from_hold - extra,
        ..Default::default()
    };
    postings::post(ws, &mut chain, &meta, d)?;
    rsv.state = ReservationState::Committed;
    rsv.committed_micros = rsv.charged_micros + from_hold + extra;
    rsv.budget_exceeded = capped || chain.iter().any(|a| a.available() < 0);
    if capped {
        tracing::warn!(reservation_id = %rsv.reservation_id, requested = req.amount_micros,
            committed = rsv.committed_micros, "commit capped: budget exceeded");
    }
    ws.put_reservation(rsv.clone());
    let resp = rsv.into_proto();
    idempotency::remember(ws, op, key, &fp, &resp)?;
    Ok(resp)
}

/// Returns the rest of the hold to available; what was charged stays spent.
pub(crate) fn release(ws: &mut WorkSet, req: &ReleaseRequest) -> Result<Reservation, LedgerError> {
    let (op, key) = ("release", req.idempotency_key.as_str());
    let fp = fp_without_key(req, |r| r.idempotency_key.clear())?;
    let (mut rsv, mut chain) =
        match load_held(ws, &req.reservation_id, op, key, &fp, "released (again)")? {
            Loaded::Replay(r) => return Ok(r),
            Loaded::Held(r, c) => (r, c),
        };
    let held = rsv.held();
    let run = run_of(&chain);
    let meta = TransferMeta {
        kind: "RELEASE",
        reservation_id: &rsv.reservation_id,
        amount_micros: held,
        run_id: &run,
        fork: &rsv.holder,
        idempotency_key: key,
        ..Default::default()
    };
    let d = Deltas {
        reserved: -held,
        available: held,
        ..Default::default()
    };
    postings::post(ws, &mut chain, &meta, d)?;
    rsv.state = ReservationState::Released;
    rsv.committed_micros = rsv.charged_micros;
    ws.put_reservation(rsv.clone());
    let resp = rsv.into_proto();
    idempotency::remember(ws, op, key, &fp, &resp)?;
    Ok(resp)
}

pub(crate) async fn require_reservation(
    conn: &mut AnyConnection,
    reservation_id: &str,
) -> Result<ReservationRow, LedgerError> {
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
