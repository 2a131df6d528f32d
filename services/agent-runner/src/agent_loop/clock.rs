//! The loop's clock and record: what it carries from turn to turn (progress, transcript,
//! the ledger's absence), heartbeats while it waits, and what stops it (cancellation,
//! the fork's timeout).

use crate::{charge::LedgerOutage, progress::ProgressSink, transcript::Transcript};
use forkyard_proto::agent::v1::AgentProgress;
use std::{future::Future, pin::Pin, time::Instant};

pub(super) enum Stop {
    Cancelled,
    Deadline,
}

pub(super) struct Loop<'a, S: ProgressSink> {
    pub(super) sink: &'a S,
    pub(super) cancelled: Pin<Box<dyn Future<Output = ()> + Send + 'a>>,
    pub(super) started: Instant,
    pub(super) deadline: Instant,
    pub(super) ticker: tokio::time::Interval,
    pub(super) progress: AgentProgress,
    pub(super) transcript: Transcript,
    /// Turns the ledger did not take.
    pub(super) ledger_outage: LedgerOutage,
}

impl<S: ProgressSink> Loop<'_, S> {
    pub(super) async fn beat(&mut self, action: &str) {
        self.progress.elapsed_ms = self.started.elapsed().as_millis() as u64;
        action.clone_into(&mut self.progress.last_action);
        self.sink.report(self.progress.clone()).await;
    }

    /// Await `fut`, heartbeating meanwhile; stop on cancellation or the deadline. On a
    /// stop `fut` is dropped: an in-flight model request is abandoned and an in-flight
    /// sandbox command is killed by the provisioner when its call goes away.
    pub(super) async fn drive<T>(
        &mut self,
        fut: impl Future<Output = T>,
        action: &str,
    ) -> Result<T, Stop> {
        tokio::pin!(fut);
        let deadline = tokio::time::Instant::from_std(self.deadline);
        loop {
            tokio::select! {
                out = &mut fut => return Ok(out),
                () = &mut self.cancelled => return Err(Stop::Cancelled),
                () = tokio::time::sleep_until(deadline) => return Err(Stop::Deadline),
                _ = self.ticker.tick() => self.beat(action).await,
            }
        }
    }
}
