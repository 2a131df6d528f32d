//! A run's search over trajectories (`RunSpec.search`, #45): when every fork of a round
//! is done, the best of that round by the run's ranking are branched into the next round
//! (as BranchFork does: from their end's snapshot and their agent's session), with the
//! search's follow-up prompt rendered from what each ended with.
//!
//! No generation of its own: only runs whose spec has a `search` (a field no earlier
//! build could set) take any of this, and for every other run it adds no command and
//! changes no state, so earlier histories replay as they ran.

use super::{branching::BranchRequest, input::ForkInput, run_state::SandboxOrchestrationWorkflow};
use crate::validate::follow_up::{self, Facts};

/// Whether a fork keeps its workspace at its end because a later round may branch it:
/// a fork of a search before its last round.
pub fn branched_later(input: &ForkInput) -> bool {
    let round = input.branch.as_ref().map_or(0, |b| b.depth) + 1;
    input.spec.search.as_ref().is_some_and(|s| round < s.rounds)
}

impl SandboxOrchestrationWorkflow {
    /// Every fork of the round is done: add the next round's branches (`true`: fly
    /// again), or end the search (`false`), saying why when rounds were left.
    pub(super) fn next_search_round(&mut self) -> bool {
        let Some(search) = self.spec.search.clone() else {
            return false;
        };
        if !self.fork_trees || self.search.round == 0 || self.search.round >= search.rounds {
            return false;
        }
        let spent: i64 = self.forks.iter().map(|f| f.cost_micros).sum();
        let depth = self.search.round - 1;
        let kept: Vec<u32> = self
            .ranking()
            .into_iter()
            .filter(|n| {
                let f = &self.forks[(*n - 1) as usize];
                f.depth == depth && !f.snapshot_id.is_empty()
            })
            .take(search.keep as usize)
            .collect();
        let why = if self.winner_found() {
            "stopped at the first verified fork"
        } else if kept.is_empty() {
            "a round left no ranked fork"
        } else if self.budget_micros - spent < self.spec.fork_budget_micros {
            "the budget left cannot start a fork"
        } else {
            ""
        };
        if !why.is_empty() {
            self.search.ended = why.into();
            return false;
        }
        let round = self.search.round + 1;
        for fork in kept {
            let (code, output) = self.search.quoted(fork);
            let facts = Facts {
                prompt: &self.spec.prompt,
                fork,
                round,
                verify_exit_code: code,
                verify_output: &output,
            };
            // Checked at launch; were it not renderable, the run's prompt again.
            let prompt = follow_up::render(&search.follow_up, &facts)
                .unwrap_or_else(|_| self.spec.prompt.clone());
            self.add_branches(&BranchRequest {
                fork,
                count: search.branches,
                prompt,
                max_forks: u32::MAX,
                point: None,
            });
        }
        self.search.round = round;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workflows::search_state::SearchState;
    use forkyard_proto::{
        common::v1::{AgentSpec, ForkResult, ForkStatus, VerifyStatus},
        gateway::v1::{RunSpec, Search},
    };

    fn run(budget_micros: i64) -> SandboxOrchestrationWorkflow {
        let mut w = SandboxOrchestrationWorkflow::starting(RunSpec {
            forks: 3,
            prompt: "fix it".into(),
            budget_micros,
            fork_budget_micros: 100_000,
            agent: Some(AgentSpec {
                driver: "command".into(),
                ..Default::default()
            }),
            search: Some(Search {
                rounds: 3,
                keep: 2,
                branches: 2,
                follow_up: "round {round} from {fork}: {verify_output}".into(),
            }),
            ..Default::default()
        });
        w.fork_trees = true;
        w
    }

    /// Fork `fork` succeeded at `cost`, its verify failing with `output`.
    fn finish(w: &mut SandboxOrchestrationWorkflow, fork: u32, cost: i64, output: &str) {
        let depth = w.forks[(fork - 1) as usize].depth;
        w.record(
            fork,
            ForkResult {
                fork,
                status: ForkStatus::Succeeded as i32,
                verify: VerifyStatus::Failed as i32,
                verify_exit_code: 1,
                verify_output_tail: output.into(),
                cost_micros: cost,
                snapshot_id: format!("snap-{fork}"),
                depth,
                ..Default::default()
            },
        );
    }

    #[test]
    fn the_best_of_a_round_are_branched_with_their_follow_up_until_the_last_round() {
        let mut w = run(10_000_000);
        assert_eq!(w.search.round, 1);
        finish(&mut w, 1, 30, "one failed");
        finish(&mut w, 2, 10, "two failed");
        finish(&mut w, 3, 20, "three failed");
        assert!(w.next_search_round());
        assert_eq!(w.search.round, 2);
        // The cheapest two (2 then 3), two branches each, numbered after the forks.
        let parents: Vec<(u32, u32, u32)> = w.forks[3..]
            .iter()
            .map(|f| (f.fork, f.parent_fork, f.depth))
            .collect();
        assert_eq!(parents, [(4, 2, 1), (5, 2, 1), (6, 3, 1), (7, 3, 1)]);
        assert_eq!(w.branches[&4].prompt, "round 2 from 2: two failed");
        assert_eq!(w.branches[&7].prompt, "round 2 from 3: three failed");
        assert_eq!(w.branches[&6].snapshot_id, "snap-3");
        // Round 2's forks, not round 1's, are kept for round 3.
        for (fork, cost) in [(4, 5), (5, 50), (6, 1), (7, 40)] {
            finish(&mut w, fork, cost, "still failing");
        }
        assert!(w.next_search_round());
        let parents: Vec<u32> = w.forks[7..].iter().map(|f| f.parent_fork).collect();
        assert_eq!(parents, [6, 6, 4, 4]);
        for fork in 8..=11 {
            finish(&mut w, fork, 1, "");
        }
        // Three rounds done: the search ends, having run every round.
        assert!(!w.next_search_round());
        assert_eq!((w.search.round, w.search.ended.as_str()), (3, ""));
    }

    #[test]
    fn a_search_ends_early_saying_why() {
        // Spent down to less than a fork's budget.
        let mut poor = run(250_000);
        finish(&mut poor, 1, 100_000, "");
        finish(&mut poor, 2, 60_000, "");
        finish(&mut poor, 3, 1, "");
        assert!(!poor.next_search_round());
        assert_eq!(poor.search.ended, "the budget left cannot start a fork");
        // A verified fork, and the run stops at its first.
        let mut first = run(10_000_000);
        first.spec.stop_on_first_verified = true;
        finish(&mut first, 1, 1, "");
        finish(&mut first, 2, 1, "");
        finish(&mut first, 3, 1, "");
        first.forks[0].verify = VerifyStatus::Passed as i32;
        assert!(!first.next_search_round());
        assert_eq!(first.search.ended, "stopped at the first verified fork");
        // Nothing succeeded: nothing is ranked.
        let mut failed = run(10_000_000);
        for fork in 1..=3 {
            failed.record(
                fork,
                ForkResult {
                    status: ForkStatus::Failed as i32,
                    ..Default::default()
                },
            );
        }
        assert!(!failed.next_search_round());
        assert_eq!(failed.search.ended, "a round left no ranked fork");
        assert_eq!(failed.forks.len(), 3);
        // A run without a search never branches on its own.
        let mut plain = run(10_000_000);
        plain.spec.search = None;
        plain.search = SearchState::starting(&plain.spec);
        finish(&mut plain, 1, 1, "");
        assert!(!plain.next_search_round());
        assert_eq!(plain.search.round, 0);
    }
}
