//! GetRun's (and WatchRun's) read path: a run's view without a workflow query per call.
//!
//! A query of a closed run replays its whole history on a gateway worker, and a query of
//! a running one waits for that worker's workflow task; at a few dozen GetRun calls a
//! second both stalled until DEADLINE_EXCEEDED (docs/performance.md). So:
//!
//! - a closed run's view never changes: it is kept (up to `closed_capacity` runs, the
//!   oldest dropped first) and served without a call to Temporal. A completed run's view
//!   is its workflow's result (one history read, no replay); only runs that ended
//!   otherwise are queried, once. Except for what PublishFork adds later: a view with a
//!   fork that may still be published is amended at once by the replica that published
//!   it, and fetched again (in the background, the kept view served meanwhile) once older
//!   than `published_ttl`, so another replica's publication shows within that;
//! - a running run's view is fetched at most once per `live_ttl` by this replica, and
//!   readers of the same run share that one fetch; a view a little older is served while
//!   a fetch refreshes it in the background (so a reader sees a view at most a few
//!   `live_ttl` old). A write through this gateway (pause, resume, cancel, raise) drops
//!   it, so its next read waits for a fresh one; another replica's write shows within
//!   those few `live_ttl`;
//! - at most `max_fetches` fetches go to Temporal at once. A read that cannot start its
//!   fetch within `shed_after` is refused at once with UNAVAILABLE (retry), never queued
//!   until its deadline.

use crate::error::GatewayError;
use forkyard_proto::gateway::v1::Run;
use futures::{
    FutureExt as _,
    future::{BoxFuture, Shared},
};
use std::{
    collections::{HashMap, VecDeque},
    future::Future,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};
use tokio::sync::Semaphore;

/// What a read serves: the run and the tenant that owns it.
#[derive(Debug, Clone)]
pub(crate) struct View {
    pub owner: String,
    pub run: Run,
    /// Closed: kept for good.
    pub closed: bool,
    /// Closed, with a fork that may still be published (PublishFork): kept, and fetched
    /// again once older than `published_ttl`.
    pub publishable: bool,
}

const LIVE_SWEEP_AT: usize = 1024;
/// A running run's view a little past `live_ttl` (up to this many times it) is served
/// as it is while a fetch refreshes it, so readers do not wait for Temporal in turn.
const STALE_SERVED: u32 = 4;

type Fetch = Shared<BoxFuture<'static, Result<Arc<View>, GatewayError>>>;

#[derive(Debug, Clone, Copy)]
pub struct ReadLimits {
    pub live_ttl: Duration,
    pub published_ttl: Duration,
    pub closed_capacity: usize,
    pub max_fetches: usize,
    pub shed_after: Duration,
}

impl Default for ReadLimits {
    fn default() -> Self {
        Self {
            live_ttl: Duration::from_millis(500),
            published_ttl: Duration::from_secs(10),
            closed_capacity: 10_000,
            max_fetches: 32,
            shed_after: Duration::from_secs(2),
        }
    }
}

#[derive(Default)]
struct Inner {
    /// Each closed run's view, and when it was fetched.
    closed: HashMap<String, (Instant, Arc<View>)>,
    /// Closed runs in the order they were kept (the first is dropped first).
    order: VecDeque<String>,
    live: HashMap<String, (Instant, Arc<View>)>,
    in_flight: HashMap<String, Fetch>,
}

/// Cheap to clone: clones share the cache.
#[derive(Clone)]
pub(crate) struct RunReads {
    inner: Arc<Mutex<Inner>>,
    fetches: Arc<Semaphore>,
    limits: ReadLimits,
}

impl RunReads {
    pub fn new(limits: ReadLimits) -> Self {
        Self {
            inner: Arc::default(),
            fetches: Arc::new(Semaphore::new(limits.max_fetches.max(1))),
            limits,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The run's view: kept, fresh, shared with a fetch already under way, or fetched
    /// with `fetch` (which must not depend on the caller: its result is everyone's).
    pub async fn get<F>(&self, run_id: &str, fetch: F) -> Result<Arc<View>, GatewayError>
    where
        F: Future<Output = Result<View, GatewayError>> + Send + 'static,
    {
        let shared = {
            let mut inner = self.lock();
            if let Some((at, v)) = inner.closed.get(run_id) {
                let v = v.clone();
                let refresh = v.publishable && at.elapsed() >= self.limits.published_ttl;
                if refresh && !inner.in_flight.contains_key(run_id) {
                    // Nobody waits for this one: the kept view is served meanwhile.
                    let f = self.fetch(run_id.to_owned(), fetch);
                    inner.in_flight.insert(run_id.to_owned(), f.clone());
                    tokio::spawn(f);
                }
                return Ok(v);
            }
            let stale = match inner.live.get(run_id) {
                Some((at, v)) if at.elapsed() < self.limits.live_ttl => return Ok(v.clone()),
                Some((at, v)) if at.elapsed() < self.limits.live_ttl * STALE_SERVED => {
                    Some(v.clone())
                }
                Some(_) => {
                    inner.live.remove(run_id);
                    None
                }
                None => None,
            };
            let shared = if let Some(f) = inner.in_flight.get(run_id) {
                f.clone()
            } else {
                let f = self.fetch(run_id.to_owned(), fetch);
                inner.in_flight.insert(run_id.to_owned(), f.clone());
                if stale.is_some() {
                    // Nobody waits for this one: it runs on its own.
                    tokio::spawn(f.clone());
                }
                f
            };
            if let Some(v) = stale {
                return Ok(v);
            }
            shared
        };
        shared.await
    }

    fn fetch<F>(&self, run_id: String, fetch: F) -> Fetch
    where
        F: Future<Output = Result<View, GatewayError>> + Send + 'static,
    {
        let this = self.clone();
        async move {
            let permit =
                tokio::time::timeout(this.limits.shed_after, this.fetches.clone().acquire_owned())
                    .await;
            let result = match permit {
                Ok(Ok(_permit)) => fetch.await.map(Arc::new),
                _ => Err(GatewayError::Unavailable(format!(
                    "run {run_id}: the gateway is reading too many runs at once; retry"
                ))),
            };
            this.settle(&run_id, &result);
            result
        }
        .boxed()
        .shared()
    }

    fn settle(&self, run_id: &str, result: &Result<Arc<View>, GatewayError>) {
        let mut inner = self.lock();
        inner.in_flight.remove(run_id);
        let Ok(view) = result else { return };
        if !view.closed {
            // Stale views are dropped as they are read; past this many, the ones of
            // runs nobody reads any more go too.
            if inner.live.len() >= LIVE_SWEEP_AT {
                let ttl = self.limits.live_ttl;
                inner.live.retain(|_, (at, _)| at.elapsed() < ttl);
            }
            inner
                .live
                .insert(run_id.to_owned(), (Instant::now(), view.clone()));
            return;
        }
        inner.live.remove(run_id);
        if inner
            .closed
            .insert(run_id.to_owned(), (Instant::now(), view.clone()))
            .is_none()
        {
            inner.order.push_back(run_id.to_owned());
        }
        while inner.closed.len() > self.limits.closed_capacity.max(1) {
            let Some(oldest) = inner.order.pop_front() else {
                break;
            };
            inner.closed.remove(&oldest);
        }
    }

    /// After a write to the run: the next read fetches again.
    pub fn forget(&self, run_id: &str) {
        self.lock().live.remove(run_id);
    }

    /// After a write to a closed run (a fork published): its kept view, if any, amended
    /// by `change`, so this replica's next read shows it at once.
    pub fn amend(&self, run_id: &str, change: impl FnOnce(&mut Run)) {
        let mut inner = self.lock();
        inner.live.remove(run_id);
        if let Some((_, v)) = inner.closed.get_mut(run_id) {
            let mut amended = View::clone(v);
            change(&mut amended.run);
            *v = Arc::new(amended);
        }
    }
}

#[cfg(test)]
#[path = "run_reads_tests.rs"]
mod tests;
