//! A run's search over trajectories (`LaunchRunRequest.search`): its shape, its follow-up
//! template, and the forks it may start in all (which the run's limits and its budget's
//! shares count).

use super::{Limits, fields::field};
use crate::error::GatewayError;
use forkyard_proto::gateway::v1::{LaunchRunRequest, RunSpec, Search};

/// The most rounds a search may have.
pub const MAX_ROUNDS: u32 = 10;
/// The longest follow-up template.
const MAX_FOLLOW_UP_BYTES: usize = 16 << 10;

/// The search as asked (absent: none), each field in bounds, the template sound, and
/// every fork it may start within the run's limit.
pub(super) fn check(
    req: &LaunchRunRequest,
    limits: &Limits,
) -> Result<Option<Search>, GatewayError> {
    let Some(s) = req.search.clone() else {
        return Ok(None);
    };
    if !(2..=MAX_ROUNDS).contains(&s.rounds) {
        return Err(field(
            "search.rounds",
            format!(
                "{} is not 2 to {MAX_ROUNDS} (the launch's forks are round 1)",
                s.rounds
            ),
        ));
    }
    if s.keep == 0 || s.keep > req.forks {
        return Err(field(
            "search.keep",
            format!("{} is not 1 to the run's {} forks", s.keep, req.forks),
        ));
    }
    if s.branches == 0 {
        return Err(field("search.branches", "must be at least 1"));
    }
    let total = planned_forks(req.forks, Some(&s));
    if total > u64::from(limits.max_forks) {
        return Err(field(
            "search",
            format!(
                "may start {total} forks (forks + (rounds - 1) * keep * branches), more than \
                 the limit of {} forks per run",
                limits.max_forks
            ),
        ));
    }
    if s.follow_up.len() > MAX_FOLLOW_UP_BYTES {
        return Err(field(
            "search.follow_up",
            format!(
                "is {} bytes; the limit is {MAX_FOLLOW_UP_BYTES}",
                s.follow_up.len()
            ),
        ));
    }
    super::fields::no_nul("search.follow_up", &s.follow_up)?;
    super::follow_up::check(&s.follow_up).map_err(|e| field("search.follow_up", e))?;
    Ok(Some(s))
}

/// Every fork a run may start: its launch's, and each later round's branches.
pub fn planned_forks(forks: u32, search: Option<&Search>) -> u64 {
    let later = search.map_or(0, |s| {
        u64::from(s.rounds.saturating_sub(1)) * u64::from(s.keep) * u64::from(s.branches)
    });
    u64::from(forks) + later
}

/// Whether a run's forks grow past its launch's (a branch window's branches, a search's
/// later rounds): such a run keeps the `max_concurrent` it asked for, its tenant slots
/// count that figure, and its forks' sandboxes' owners are kept for their snapshots.
pub fn grows(spec: &RunSpec) -> bool {
    spec.branch_window_secs > 0 || spec.search.is_some()
}
