//! Which workflow changes a run takes (Temporal patches).
//!
//! Runs started by this build decide it once, with one patch
//! ([`DECIDED_AT_START`]) in the workflow's first activation, before anything is
//! awaited: such a run takes every change listed here. Runs started by earlier builds
//! have no such marker; for them each change is asked for where those builds asked
//! for it, so their histories replay unchanged.
//!
//! Why at the start: when a query arrives while a local activity runs, sdk-core (0.10)
//! answers it by completing the workflow task, and if the activity had just finished,
//! its marker goes into that task while the workflow sees the result only in the next
//! one. A replay hands the result over one task earlier, so a `patched` call made after
//! it looks for its marker in the wrong task, finds none, and the replay fails (TMPRL1100
//! "patch marker encountered … no corresponding change command"), and with it every read
//! of the run. Before the first await nothing can be handed over early.
//!
//! A new change: add it to [`Change`] and take it where `decided_at_start` holds; never
//! call `patched` after an await.

use temporalio_workflow::WorkflowContext;

/// The one patch of runs started by this build and later ones.
const DECIDED_AT_START: &str = "patches-decided-at-start";

/// Changes introduced by earlier builds, each with the patch those builds recorded.
#[derive(Clone, Copy, Debug)]
pub enum Change {
    /// A fork whose sandbox is lost starts again on a new one.
    RequeueLostSandbox,
    /// A re-started fork reserves what its fork budget has left.
    LostForkWithinBudget,
    /// Wave preparation retries for longer (more timers).
    PrepareOutlastsAnOutage,
    /// A settlement the ledger did not take in time is posted again durably.
    DurableSettle,
    /// A finished run publishes how it ended as a search attribute.
    RunOutcomeAttribute,
}

impl Change {
    fn patch_id(self) -> &'static str {
        match self {
            Self::RequeueLostSandbox => "requeue-lost-sandbox",
            Self::LostForkWithinBudget => "lost-fork-within-budget",
            Self::PrepareOutlastsAnOutage => "prepare-outlasts-an-outage",
            Self::DurableSettle => "durable-settle",
            Self::RunOutcomeAttribute => "run-outcome-attribute",
        }
    }
}

/// What a workflow decided in its first activation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Patches {
    decided_at_start: bool,
}

impl Patches {
    /// Call in the workflow's first activation, before its first await.
    pub fn decide<W>(ctx: &WorkflowContext<W>) -> Self {
        Self {
            decided_at_start: ctx.patched(DECIDED_AT_START),
        }
    }

    /// Whether the run takes `change`. For a run started by an earlier build this asks
    /// the history, so call it where that build did (the same places, the same order).
    pub fn takes<W>(self, ctx: &WorkflowContext<W>, change: Change) -> bool {
        self.decided_at_start || ctx.patched(change.patch_id())
    }
}
