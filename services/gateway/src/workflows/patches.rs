//! Which workflow changes a run takes (Temporal patches).
//!
//! Runs started by this build decide it once, with one patch naming the newest
//! generation of changes this build has ([`GENERATIONS`]), in the workflow's first
//! activation, before anything is awaited: such a run takes every change of that
//! generation and the older ones. Runs started by earlier builds have an older
//! generation's marker (and take only its changes), or none at all (builds before
//! generations): for those each change is asked for where those builds asked for it, so
//! their histories replay unchanged.
//!
//! Why at the start: when a query arrives while a local activity runs, sdk-core (0.10)
//! answers it by completing the workflow task, and if the activity had just finished,
//! its marker goes into that task while the workflow sees the result only in the next
//! one. A replay hands the result over one task earlier, so a `patched` call made after
//! it looks for its marker in the wrong task, finds none, and the replay fails (TMPRL1100
//! "patch marker encountered … no corresponding change command"), and with it every read
//! of the run. Before the first await nothing can be handed over early.
//!
//! A new change: add a generation to [`GENERATIONS`] (a new patch id, appended), add the
//! change to [`Change`] with that generation, and take it where [`Patches::takes`] says
//! so. A run started by the previous build, replayed by the new one, has the previous
//! generation's marker and so does not take the new change, as it did not when it ran.
//! Never call `patched` after an await.

use temporalio_workflow::WorkflowContext;

/// The patch each generation of changes records at a run's start, oldest first; a run
/// takes the changes of its generation and of the older ones. Only ever appended to.
const GENERATIONS: &[&str] = &[
    "patches-decided-at-start",
    "account-opened-with-first-wave",
    "later-waves-are-activities",
    "finishes-beside-waves",
    "delivers-results",
    "backend-per-run",
    FORK_TREES,
    SEVERAL_BACKENDS,
    REFUSED_FORK_WAITS,
];

/// Fork trees (#45): the generation is found by name, not by place, so that it stays
/// right whichever generations a merge puts before it.
const FORK_TREES: &str = "fork-trees";

/// #44 item 2: found by name, like [`FORK_TREES`].
const SEVERAL_BACKENDS: &str = "several-backends";

/// #44: found by name, like [`FORK_TREES`].
const REFUSED_FORK_WAITS: &str = "refused-fork-waits-for-room";

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
    /// The run's ledger account is opened by its first wave's activity, beside the
    /// creates, instead of by a local activity of its own before it.
    AccountOpenedWithFirstWave,
    /// Every wave after the first is prepared by a regular activity on the gateway's own
    /// queue, not a local one: a local activity holds the run's workflow task open, and
    /// while it ran the other forks' completions piled up behind it; past 100 buffered
    /// events Temporal force-fails the task (the worker then replays the whole history).
    LaterWavesAreActivities,
    /// A wave's preparation runs beside the forks in flight: a fork that finished is
    /// finished while a wave waits for a provisioner (it used to wait behind the wave's
    /// retries, and a draining provisioner waited for that fork: each for the other).
    /// And a create a draining replica refused is tried again, 60 s apart, for as long as
    /// the fork's timeout, not only within the wave's retry rounds.
    FinishesBesideWaves,
    /// Once its forks are done, a run that asks for it pushes the chosen forks' branches
    /// and opens their pull requests (`LaunchRunRequest.delivery`), by one activity.
    DeliversResults,
    /// Each fork's sandbox is created on the run's backend (`RunSpec.backend`: local or
    /// e2b), not on local whatever the run asked.
    BackendPerRun,
    /// Fork trees: a run open for branches (`RunSpec::branch_window_secs`) snapshots
    /// each fork's workspace at its end, takes BranchFork updates, stays open for the
    /// window after its last fork, and removes its snapshots when it closes.
    ForkTrees,
    /// A run over several backends (`RunSpec.backends`): each fork is placed on the first
    /// backend with room for it (forks in flight there under its share) and waits while
    /// none has; a create its backend refuses moves the fork to the next one with room.
    SeveralBackends,
    /// A run over several backends: a fork whose create its backend refused, with no
    /// backend after it with room, waits (pending) for room on those instead of failing
    /// once its wave's retry rounds are over; and a fork retried after a refusal is
    /// created where it was moved to, never back on an earlier backend.
    RefusedForkWaits,
}

impl Change {
    /// The generation that takes it at a run's start (1-based in [`GENERATIONS`]).
    fn generation(self) -> usize {
        match self {
            Self::RequeueLostSandbox
            | Self::LostForkWithinBudget
            | Self::PrepareOutlastsAnOutage
            | Self::DurableSettle
            | Self::RunOutcomeAttribute => 1,
            Self::AccountOpenedWithFirstWave => 2,
            Self::LaterWavesAreActivities => 3,
            Self::FinishesBesideWaves => 4,
            Self::DeliversResults => 5,
            Self::BackendPerRun => 6,
            Self::ForkTrees => generation_of(FORK_TREES),
            Self::SeveralBackends => generation_of(SEVERAL_BACKENDS),
            Self::RefusedForkWaits => generation_of(REFUSED_FORK_WAITS),
        }
    }

    /// The patch builds before generations asked for at the change's place.
    fn patch_id(self) -> &'static str {
        match self {
            Self::RequeueLostSandbox => "requeue-lost-sandbox",
            Self::LostForkWithinBudget => "lost-fork-within-budget",
            Self::PrepareOutlastsAnOutage => "prepare-outlasts-an-outage",
            Self::DurableSettle => "durable-settle",
            Self::RunOutcomeAttribute => "run-outcome-attribute",
            // Never asked for by a build before generations (it has generation 2).
            Self::AccountOpenedWithFirstWave => GENERATIONS[1],
            Self::LaterWavesAreActivities => GENERATIONS[2],
            Self::FinishesBesideWaves => GENERATIONS[3],
            Self::DeliversResults => GENERATIONS[4],
            Self::BackendPerRun => GENERATIONS[5],
            Self::ForkTrees => FORK_TREES,
            Self::SeveralBackends => SEVERAL_BACKENDS,
            Self::RefusedForkWaits => REFUSED_FORK_WAITS,
        }
    }
}

/// The generation (1-based) whose patch is `id`.
fn generation_of(id: &str) -> usize {
    GENERATIONS
        .iter()
        .position(|g| *g == id)
        .map_or(usize::MAX, |i| i + 1)
}

/// What a workflow decided in its first activation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Patches {
    /// 0: started by a build before generations.
    generation: usize,
}

impl Patches {
    /// Call in the workflow's first activation, before its first await. A new run
    /// records the newest generation; a replayed one finds the generation it recorded.
    pub fn decide<W>(ctx: &WorkflowContext<W>) -> Self {
        let generation = (1..=GENERATIONS.len())
            .rev()
            .find(|g| ctx.patched(GENERATIONS[g - 1]))
            .unwrap_or(0);
        Self { generation }
    }

    /// Whether the run takes `change`. For a run started by a build before generations
    /// this asks the history, so call it where that build did (the same places, the same
    /// order).
    pub fn takes<W>(self, ctx: &WorkflowContext<W>, change: Change) -> bool {
        if self.generation > 0 {
            return self.generation >= change.generation();
        }
        change.generation() == 1 && ctx.patched(change.patch_id())
    }
}
