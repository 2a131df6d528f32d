//! A batch's working set: the rows its calls read (loaded and locked up front by
//! [`crate::load`]), changed in memory call by call, and the rows they add, written at the
//! end of the batch by [`crate::flush`]. Each call runs between [`WorkSet::begin_call`]
//! and, if it fails, [`WorkSet::undo_call`], which puts back everything it changed: an
//! in-memory savepoint, so a refused call posts nothing.

use crate::{
    error::LedgerError,
    model::{AccountRow, ReservationRow},
};
use std::collections::{BTreeSet, HashMap};

/// A stored idempotency key.
#[derive(Debug, Clone)]
pub(crate) struct StoredKey {
    pub operation: String,
    pub fingerprint: String,
    /// The response as JSON.
    pub response: String,
    pub created_unix_ms: i64,
}

/// A new row of `transfers`.
#[derive(Debug)]
pub(crate) struct TransferRow {
    pub transfer_id: String,
    pub kind: &'static str,
    pub account_id: String,
    pub reservation_id: String,
    pub amount_micros: i64,
    pub spent_micros: i64,
    pub run_id: String,
    pub fork: String,
    pub model: String,
    pub tenant_id: String,
    pub idempotency_key: String,
    pub created_unix_ms: i64,
}

/// A new row of `postings`.
#[derive(Debug)]
pub(crate) struct PostingRow {
    pub account_id: String,
    pub seq: i64,
    pub transfer_id: String,
    pub bucket: &'static str,
    pub amount_micros: i64,
    pub created_unix_ms: i64,
}

#[derive(Debug)]
enum Undo {
    Account(String, Option<AccountRow>),
    Reservation(String, Option<ReservationRow>),
    Key(String, Option<StoredKey>),
}

#[derive(Debug, Default)]
pub(crate) struct WorkSet {
    accounts: HashMap<String, AccountRow>,
    reservations: HashMap<String, ReservationRow>,
    keys: HashMap<String, StoredKey>,
    /// Accounts and reservations to write back (inserted or updated), in key order.
    dirty_accounts: BTreeSet<String>,
    dirty_reservations: BTreeSet<String>,
    new_keys: Vec<String>,
    transfers: Vec<TransferRow>,
    postings: Vec<PostingRow>,
    undo: Vec<Undo>,
    /// Lengths of `new_keys`, `transfers` and `postings` when the current call began.
    marks: (usize, usize, usize),
}

impl WorkSet {
    /// The rows as loaded from the database.
    pub(crate) fn new(
        accounts: Vec<AccountRow>,
        reservations: Vec<ReservationRow>,
        keys: Vec<(String, StoredKey)>,
    ) -> Self {
        Self {
            accounts: accounts
                .into_iter()
                .map(|a| (a.account_id.clone(), a))
                .collect(),
            reservations: reservations
                .into_iter()
                .map(|r| (r.reservation_id.clone(), r))
                .collect(),
            keys: keys.into_iter().collect(),
            ..Default::default()
        }
    }

    pub(crate) fn begin_call(&mut self) {
        self.undo.clear();
        self.marks = (
            self.new_keys.len(),
            self.transfers.len(),
            self.postings.len(),
        );
    }

    /// Puts back everything the current call changed.
    pub(crate) fn undo_call(&mut self) {
        while let Some(u) = self.undo.pop() {
            match u {
                Undo::Account(id, old) => restore(&mut self.accounts, id, old),
                Undo::Reservation(id, old) => restore(&mut self.reservations, id, old),
                Undo::Key(key, old) => restore(&mut self.keys, key, old),
            }
        }
        self.new_keys.truncate(self.marks.0);
        self.transfers.truncate(self.marks.1);
        self.postings.truncate(self.marks.2);
    }

    pub(crate) fn account(&self, id: &str) -> Option<&AccountRow> {
        self.accounts.get(id)
    }

    pub(crate) fn require_account(&self, id: &str) -> Result<AccountRow, LedgerError> {
        self.account(id)
            .cloned()
            .ok_or_else(|| LedgerError::NotFound(format!("account {id:?} not found")))
    }

    /// The account and, for a run with a tenant, the tenant after it.
    pub(crate) fn chain(&self, id: &str) -> Result<Vec<AccountRow>, LedgerError> {
        let account = self.require_account(id)?;
        if account.parent_account_id.is_empty() {
            return Ok(vec![account]);
        }
        let parent = self.require_account(&account.parent_account_id)?;
        Ok(vec![account, parent])
    }

    pub(crate) fn put_account(&mut self, row: AccountRow) {
        let id = row.account_id.clone();
        self.dirty_accounts.insert(id.clone());
        let old = self.accounts.insert(id.clone(), row);
        self.undo.push(Undo::Account(id, old));
    }

    pub(crate) fn reservation(&self, id: &str) -> Result<ReservationRow, LedgerError> {
        self.reservations
            .get(id)
            .cloned()
            .ok_or_else(|| LedgerError::NotFound(format!("reservation {id:?} not found")))
    }

    pub(crate) fn put_reservation(&mut self, row: ReservationRow) {
        let id = row.reservation_id.clone();
        self.dirty_reservations.insert(id.clone());
        let old = self.reservations.insert(id.clone(), row);
        self.undo.push(Undo::Reservation(id, old));
    }

    pub(crate) fn key(&self, key: &str) -> Option<&StoredKey> {
        self.keys.get(key)
    }

    pub(crate) fn put_key(&mut self, key: String, stored: StoredKey) {
        self.new_keys.push(key.clone());
        let old = self.keys.insert(key.clone(), stored);
        self.undo.push(Undo::Key(key, old));
    }

    pub(crate) fn push_transfer(&mut self, row: TransferRow) {
        self.transfers.push(row);
    }

    pub(crate) fn push_posting(&mut self, row: PostingRow) {
        self.postings.push(row);
    }

    /// The accounts to write back.
    pub(crate) fn dirty_accounts(&self) -> Vec<&AccountRow> {
        self.dirty_accounts
            .iter()
            .filter_map(|id| self.accounts.get(id))
            .collect()
    }

    /// The reservations to write back.
    pub(crate) fn dirty_reservations(&self) -> Vec<&ReservationRow> {
        self.dirty_reservations
            .iter()
            .filter_map(|id| self.reservations.get(id))
            .collect()
    }

    /// The keys to insert, with what they store.
    pub(crate) fn new_keys(&self) -> Vec<(&str, &StoredKey)> {
        self.new_keys
            .iter()
            .filter_map(|k| self.keys.get(k).map(|s| (k.as_str(), s)))
            .collect()
    }

    pub(crate) fn transfers(&self) -> &[TransferRow] {
        &self.transfers
    }

    pub(crate) fn postings(&self) -> &[PostingRow] {
        &self.postings
    }
}

fn restore<V>(map: &mut HashMap<String, V>, id: String, old: Option<V>) {
    match old {
        Some(v) => {
            map.insert(id, v);
        }
        None => {
            map.remove(&id);
        }
    }
}
