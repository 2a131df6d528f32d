//! How a fork is charged: what its commit posts (the agent's spend with its sandbox's
//! whole cost), whether it commits or releases its reservation, and the ledger requests
//! of that settlement. One rule for inline forks and child workflows.

use super::item::FinishItem;
use forkyard_proto::budget::v1::{CommitRequest, ReleaseRequest};

/// What a fork's commit posts, and the sandbox's part of it: the agent's spend (`cost`,
/// of which `sandbox_charged` was sandbox time charged while it ran) with the sandbox's
/// whole cost in place of that part, when it is known (read at patch collection, never
/// less than what was charged for it).
pub fn commit_amount(cost: i64, sandbox_charged: i64, sandbox_cost: Option<i64>) -> (i64, i64) {
    let sandbox = sandbox_cost.unwrap_or(0).max(sandbox_charged);
    (cost - sandbox_charged + sandbox, sandbox)
}

/// One fork's settlement: commit what it spent, or release the reservation.
#[derive(Debug, Clone, Default)]
pub struct Settlement {
    pub commit: bool,
    pub reservation_id: String,
    pub amount_micros: i64,
    /// The idempotency key of the first try, so a durable retry posts it once.
    pub key: String,
}

impl Settlement {
    /// The fork's settlement once its patch step is over: it commits what it spent (with
    /// the sandbox's whole cost, `sandbox_cost`, read with its patch), or, when that is
    /// nothing, commits only if it succeeds (`patched`: its patch is in) and releases
    /// otherwise. Also the sandbox's part of the amount.
    pub fn of(fork: &FinishItem, sandbox_cost: Option<i64>, patched: bool) -> (Self, i64) {
        let (amount, sandbox) =
            commit_amount(fork.cost_micros, fork.sandbox_charged_micros, sandbox_cost);
        let commit = amount > 0 || (fork.succeeds_with_patch && patched);
        let settlement = Self {
            commit,
            reservation_id: fork.reservation_id.clone(),
            amount_micros: amount,
            key: if commit {
                fork.commit_key.clone()
            } else {
                fork.release_key.clone()
            },
        };
        (settlement, sandbox)
    }

    /// The step's name in a fork's error.
    pub fn step(&self) -> &'static str {
        if self.commit {
            "commit spend"
        } else {
            "release reservation"
        }
    }

    pub fn commit_request(&self) -> CommitRequest {
        CommitRequest {
            reservation_id: self.reservation_id.clone(),
            amount_micros: self.amount_micros,
            idempotency_key: self.key.clone(),
        }
    }

    pub fn release_request(&self) -> ReleaseRequest {
        ReleaseRequest {
            reservation_id: self.reservation_id.clone(),
            idempotency_key: self.key.clone(),
        }
    }
}
