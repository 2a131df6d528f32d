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
        (Self::made(fork, commit, amount), sandbox)
    }

    /// The fork's settlement that commits `amount_micros`, or releases, under the key of
    /// that step (so a settlement posted again is posted once).
    pub fn made(fork: &FinishItem, commit: bool, amount_micros: i64) -> Self {
        Self {
            commit,
            reservation_id: fork.reservation_id.clone(),
            amount_micros,
            key: if commit {
                fork.commit_key.clone()
            } else {
                fork.release_key.clone()
            },
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn fork(cost: i64, sandbox_charged: i64, succeeds: bool) -> FinishItem {
        FinishItem {
            reservation_id: "res-1".into(),
            cost_micros: cost,
            sandbox_charged_micros: sandbox_charged,
            succeeds_with_patch: succeeds,
            commit_key: "run/fork-1/a1/commit".into(),
            release_key: "run/fork-1/a1/release".into(),
            ..FinishItem::default()
        }
    }

    #[test]
    fn the_sandbox_s_whole_cost_replaces_what_was_charged_for_it_never_less() {
        assert_eq!(commit_amount(100, 30, Some(50)), (120, 50));
        assert_eq!(commit_amount(100, 30, Some(10)), (100, 30));
        assert_eq!(commit_amount(100, 30, None), (100, 30));
    }

    #[test]
    fn a_fork_commits_what_it_spent_or_succeeding_nothing_and_releases_otherwise() {
        let (s, _) = Settlement::of(&fork(0, 0, true), None, true);
        assert!(s.commit && s.amount_micros == 0 && s.key.ends_with("/commit"));
        // Its patch not in: it does not succeed.
        let (s, _) = Settlement::of(&fork(0, 0, true), None, false);
        assert!(!s.commit && s.key.ends_with("/release"));
        let (s, sandbox) = Settlement::of(&fork(10, 0, false), Some(5), true);
        assert!(s.commit && s.amount_micros == 15 && sandbox == 5);
        assert_eq!(s.commit_request().idempotency_key, "run/fork-1/a1/commit");
    }
}
