//! A fork to finish: what its last steps start from, whichever path runs them (see
//! [`super::finish`]).

use super::AtOwner;
use serde::{Deserialize, Serialize};

/// One fork to finish: an item of the finish activity's batch (its input, part of the
/// run's history: fields are only ever added), and what the child finishes.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct FinishItem {
    /// For the fork's span.
    pub run_id: String,
    pub fork: u32,
    pub sandbox: AtOwner,
    /// Collect the patch first (the agent ran, successfully or not).
    pub collect_patch: bool,
    /// The fork succeeds if its patch is collected: it commits even what costs nothing.
    pub succeeds_with_patch: bool,
    pub reservation_id: String,
    pub cost_micros: i64,
    /// Of `cost_micros`, the sandbox time the agent charged as it ran.
    pub sandbox_charged_micros: i64,
    pub commit_key: String,
    pub release_key: String,
    /// The agent lost the sandbox (its replica went away): its destroy is tried briefly,
    /// since the fork starts again elsewhere and must not wait for a replica that is gone.
    pub sandbox_lost: bool,
    /// Snapshot the workspace before the sandbox goes: the fork's branch point, for a run
    /// open for branches (fork trees).
    pub snapshot: bool,
}
