//! What the run loop waits for: forks that finished (the first to complete, then every
//! other one already done), the wave being prepared, or a signal or an update; and, with
//! nothing in flight, a resume, a raise or a cancel.

use super::Flight;
use crate::workflows::{
    failure::StepFailure,
    prepare::{self, WaveFork},
    start::{ChildOutcome, InFlight},
};
use futures::{FutureExt, future::select_all};
use temporalio_workflow::{WaitConditionOptions, WorkflowCancellationToken};

/// The forks in flight that are done already, taken out in vector order; polled once,
/// with this task's own waker (the SDK refuses foreign wakers).
async fn done_already(in_flight: &mut Vec<InFlight<'_>>) -> Vec<(u32, ChildOutcome)> {
    std::future::poll_fn(|cx| {
        let mut ready = Vec::new();
        let mut i = 0;
        while i < in_flight.len() {
            if let std::task::Poll::Ready(out) = in_flight[i].as_mut().poll(cx) {
                drop(in_flight.remove(i));
                ready.push(out);
            } else {
                i += 1;
            }
        }
        std::task::Poll::Ready(ready)
    })
    .await
}

/// What the run loop woke up for.
pub(super) enum Event {
    /// Forks finished (see [`Flight::next_event`]).
    Finished(Vec<(u32, ChildOutcome)>),
    /// The wave being prepared is ready (or stopped).
    Prepared(Vec<WaveFork>, Vec<Result<prepare::Prepared, StepFailure>>),
    /// A signal or an update changed the run's state.
    Changed,
}

impl Flight<'_> {
    /// Nothing in flight: paused or out of budget with forks pending, wait for resume, a
    /// raise or a cancel (`true`); otherwise the run is done (`false`).
    pub(super) async fn wait_while_held(&self, cancel: &WorkflowCancellationToken) -> bool {
        let ctx = self.ctx;
        let waiting = ctx.state(|s| s.has_pending() && (s.paused || s.awaiting_budget));
        if !waiting || cancel.is_cancelled() {
            return false;
        }
        let seen = ctx.state(|s| s.generation);
        let _ = ctx.wait_condition(|s| s.generation != seen).await;
        true
    }

    /// What comes first: forks that finished (the first to complete, then every other
    /// one already done, in vector order, so the next wave prepares their successors
    /// together), the wave being prepared, or a signal or an update.
    pub(super) async fn next_event(&mut self) -> Event {
        let ctx = self.ctx;
        let seen = ctx.state(|s| s.generation);
        // Not tied to the run's cancellation: once cancelled, the forks (which inherit
        // it) finish their cleanup and complete, and that is what to wait for.
        let detached = WaitConditionOptions::builder()
            .cancellation_token(WorkflowCancellationToken::new())
            .build();
        let done = {
            let changed = ctx
                .wait_condition_with_options(move |s| s.generation != seen, detached)
                .fuse();
            let in_flight = &mut self.in_flight;
            let next = async {
                if in_flight.is_empty() {
                    std::future::pending::<()>().await;
                }
                let (out, index, _) = select_all(in_flight.iter_mut()).await;
                (out, index)
            }
            .fuse();
            let preparing = &mut self.preparing;
            let prepared = async {
                match preparing.as_mut() {
                    Some(p) => p.await,
                    None => std::future::pending().await,
                }
            }
            .fuse();
            futures::pin_mut!(changed, next, prepared);
            // Completions first, then the wave, so a replay sees the same order.
            futures::select_biased! {
                done = next => Some(done),
                (wave, outcomes) = prepared => return Event::Prepared(wave, outcomes),
                _ = changed => None,
            }
        };
        let Some((first, index)) = done else {
            return Event::Changed;
        };
        drop(self.in_flight.remove(index));
        let mut finished = vec![first];
        finished.extend(done_already(&mut self.in_flight).await);
        Event::Finished(finished)
    }
}
