//! Where an agent's progress goes while it runs (activity heartbeats, or nowhere), and
//! when the first report is due. Both drivers report through these.

use forkyard_proto::agent::v1::AgentProgress;
use std::future::Future;

/// Where progress goes while the agent runs (activity heartbeats, or nowhere).
pub trait ProgressSink {
    fn report(&self, progress: AgentProgress) -> impl Future<Output = ()>;
}

pub struct NoProgress;
impl ProgressSink for NoProgress {
    async fn report(&self, _: AgentProgress) {}
}

/// The heartbeat ticker: its first tick one interval after the start, not at once. A
/// heartbeat at the start carries nothing to resume from and costs Temporal a write per
/// fork; an agent that finishes within the interval never needs one (the heartbeat
/// timeout is longer than the longest interval allowed).
pub(crate) fn first_beat_after(every: std::time::Duration) -> tokio::time::Interval {
    let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticker
}
