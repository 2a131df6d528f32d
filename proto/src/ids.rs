//! The names that cross services, formed in one place: a fork's id (its child workflow's
//! id, the prefix of every idempotency key its steps charge and release under, where its
//! transcripts are kept) and a fork's branch. The gateway, the agent runner and the
//! ledger's keys must agree on them to the byte — a key formed two ways is a charge made
//! twice — so none of them formats one by hand.

use std::fmt;

/// A fork of a run, printed `{run_id}/fork-{n}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ForkId<'a> {
    pub run_id: &'a str,
    pub fork: u32,
}

impl<'a> ForkId<'a> {
    pub const fn new(run_id: &'a str, fork: u32) -> Self {
        Self { run_id, fork }
    }

    /// The fork's own part of the id (`fork-{n}`): a directory under its run's.
    pub fn segment(fork: u32) -> String {
        format!("fork-{fork}")
    }
}

impl fmt::Display for ForkId<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/fork-{}", self.run_id, self.fork)
    }
}

/// The branch fork `fork`'s work is named by: `{prefix}-fork-{n}` (the run's branch, or
/// its delivery's prefix).
pub fn fork_branch(prefix: &str, fork: u32) -> String {
    format!("{prefix}-fork-{fork}")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// These strings are in recorded histories and the ledger's keys: they never change.
    #[test]
    fn a_forks_id_and_branch_are_what_runs_have_always_recorded() {
        assert_eq!(ForkId::new("run-abc", 3).to_string(), "run-abc/fork-3");
        assert_eq!(ForkId::segment(3), "fork-3");
        assert_eq!(fork_branch("forkyard", 12), "forkyard-fork-12");
    }
}
