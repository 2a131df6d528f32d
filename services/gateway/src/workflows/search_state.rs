//! Where a run's search is (`rounds`): its round, why it ended early, and what each
//! finished fork's follow-up prompt may quote. Part of the run's state.

use forkyard_proto::{common::v1::ForkResult, gateway::v1::RunSpec};
use std::collections::BTreeMap;

/// The most of a fork's verify output a follow-up prompt quotes (its end).
const VERIFY_TAIL_BYTES: usize = 4 << 10;

/// Where a run's search is.
#[derive(Debug, Default)]
pub struct SearchState {
    /// The round in flight (1: the launch's forks); 0 for a run without a search.
    pub round: u32,
    /// Why the search ended before its last round.
    pub ended: String,
    /// Each finished fork's verify exit code and the end of its output, for the
    /// follow-up prompts of its branches (the run's copy of a fork keeps no output).
    verify: BTreeMap<u32, (i32, String)>,
}

impl SearchState {
    pub fn starting(spec: &RunSpec) -> Self {
        Self {
            round: u32::from(spec.search.is_some()),
            ..Self::default()
        }
    }

    /// Keep what a follow-up prompt may quote of a fork that finished (`result` in full).
    pub fn note(&mut self, fork: u32, result: &ForkResult) {
        if self.round == 0 {
            return;
        }
        let out = &result.verify_output_tail;
        let mut from = out.len().saturating_sub(VERIFY_TAIL_BYTES);
        while !out.is_char_boundary(from) {
            from += 1;
        }
        self.verify
            .insert(fork, (result.verify_exit_code, out[from..].to_owned()));
    }

    /// What `fork`'s follow-ups may quote: its verify exit code and output's end.
    pub fn quoted(&self, fork: u32) -> (i32, String) {
        self.verify.get(&fork).cloned().unwrap_or_default()
    }
}
