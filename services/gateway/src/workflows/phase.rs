//! Where a fork is, as `ForkResult::phase`.

pub const PENDING: &str = "pending";
pub const RESERVING: &str = "reserving budget";
/// Budget reserved, sandbox made and health-checked (one step for the run).
pub const CREATING: &str = "creating sandbox";
pub const AGENT: &str = "running agent";
pub const VERIFYING: &str = "verifying";
pub const PATCH: &str = "collecting patch";
pub const CLEANUP: &str = "cleaning up";
pub const DONE: &str = "done";
/// The run's budget could not cover this fork's reservation: it waits for RaiseBudget.
pub const AWAITING_BUDGET: &str = "awaiting budget";
/// Its backend refused its create and the run's later backends were full: it waits for
/// a fork in flight there to end (a run over several backends).
pub const WAITING_FOR_ROOM: &str = "waiting for room";
