//! `/runs/<id>/events`: the run page kept live. The gateway's `WatchRun` events are
//! gathered for a short window and applied to the run as the page drew it; each batch
//! becomes one Server-Sent Event `patch` carrying the redrawn fork rows and summary
//! (server-rendered, escaped HTML by element id), so a busy run costs the browser one
//! redraw per window, not one per event. `end` when the run has finished.

use crate::{AppState, ConsoleError, format, gateway, run_page, session::Session};
use axum::{
    Extension,
    extract::{Path, State},
    response::sse::{Event, KeepAlive, Sse},
};
use forkyard_proto::gateway::v1::{Run, RunEvent, WatchRunRequest, run_event::Kind};
use futures::{Stream, StreamExt as _};
use std::{collections::BTreeMap, convert::Infallible, time::Duration};

/// How long events are gathered before the page is told.
const BATCH_WINDOW: Duration = Duration::from_millis(250);
const BATCH_MAX: usize = 512;

pub async fn events(
    State(state): State<AppState>,
    Extension(session): Extension<Session>,
    Path(run_id): Path<String>,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, ConsoleError> {
    let req = WatchRunRequest {
        run_id: run_id.clone(),
    };
    let watch = state
        .gateway
        .client()
        .watch_run(gateway::request(session.key.as_ref(), req)?)
        .await?
        .into_inner();
    let mut view = View::new(session);
    let batches = tokio_stream::StreamExt::chunks_timeout(watch, BATCH_MAX, BATCH_WINDOW);
    let patches = batches
        .map(move |batch| {
            let events: Vec<RunEvent> = batch.into_iter().map_while(Result::ok).collect();
            view.apply(&events)
        })
        .filter_map(|patch| async move { patch })
        .map(|json| Ok(Event::default().event("patch").data(json)))
        .chain(futures::stream::once(async {
            Ok(Event::default().event("end").data("finished"))
        }));
    // Comments well inside the listener's idle timeout keep a quiet run's stream open.
    Ok(Sse::new(patches).keep_alive(KeepAlive::new().interval(Duration::from_secs(15))))
}

/// The run as the watch has told it so far.
pub struct View {
    run: Option<Run>,
    /// The watcher's session: the summary's cancel form carries its CSRF token.
    session: Session,
}

impl View {
    pub fn new(session: Session) -> Self {
        Self { run: None, session }
    }

    /// Applies a batch; the JSON of the elements to redraw (id → HTML), or `None` when
    /// nothing visible changed.
    pub fn apply(&mut self, events: &[RunEvent]) -> Option<String> {
        let mut forks = std::collections::BTreeSet::new();
        let mut summary = false;
        for ev in events {
            match (Kind::try_from(ev.kind), ev.run.as_ref()) {
                (Ok(Kind::Snapshot | Kind::RunFinished), Some(run)) => {
                    self.run = Some(run.clone());
                    forks.extend(run.forks.iter().map(|f| f.fork));
                    summary = true;
                }
                _ => summary |= self.apply_one(ev, &mut forks),
            }
        }
        let run = self.run.as_ref()?;
        let now = format::now_ms();
        let mut html: BTreeMap<String, String> = forks
            .into_iter()
            .filter_map(|n| run.forks.get(n.checked_sub(1)? as usize))
            .map(|f| {
                (
                    format!("fork-{}", f.fork),
                    run_page::fork_row(&run.run_id, f, now).0,
                )
            })
            .collect();
        if summary {
            html.insert(
                "run-summary".into(),
                run_page::summary(run, &self.session).0,
            );
        }
        (!html.is_empty()).then(|| serde_json::json!({ "html": html }).to_string())
    }

    /// One fork or state event; whether the summary changed.
    fn apply_one(&mut self, ev: &RunEvent, forks: &mut std::collections::BTreeSet<u32>) -> bool {
        let Some(run) = self.run.as_mut() else {
            return false;
        };
        if let Ok(Kind::RunStateChanged) = Kind::try_from(ev.kind) {
            run.state = ev.state;
            return true;
        }
        let Some(result) = ev.fork_result.as_ref() else {
            return false;
        };
        let Some(slot) = (ev.fork as usize)
            .checked_sub(1)
            .and_then(|i| run.forks.get_mut(i))
        else {
            return false;
        };
        *slot = result.clone();
        forks.insert(ev.fork);
        recount(run);
        true
    }
}

/// The run's counts and cost from its forks, between the snapshots that carry them.
fn recount(run: &mut Run) {
    use forkyard_proto::common::v1::ForkStatus as S;
    let count = |s: S| run.forks.iter().filter(|f| f.status == s as i32).count() as u32;
    run.forks_succeeded = count(S::Succeeded);
    run.forks_running = count(S::Running);
    run.forks_pending = count(S::Pending);
    run.forks_failed = run.forks.len() as u32
        - run.forks_succeeded
        - run.forks_running
        - run.forks_pending
        - count(S::Cancelled);
    let spent: i64 = run.forks.iter().map(|f| f.cost_micros).sum();
    run.cost_micros = run.cost_micros.max(spent);
}

#[cfg(test)]
mod tests {
    use super::*;
    use forkyard_proto::common::v1::{ForkResult, ForkStatus};

    fn fork(n: u32, status: ForkStatus) -> ForkResult {
        ForkResult {
            fork: n,
            status: status as i32,
            ..Default::default()
        }
    }

    fn session() -> Session {
        Session {
            key: None,
            csrf: "t".repeat(64),
            secure: false,
        }
    }

    fn snapshot() -> RunEvent {
        RunEvent {
            kind: Kind::Snapshot as i32,
            run: Some(Run {
                run_id: "run-x".into(),
                forks: vec![fork(1, ForkStatus::Running), fork(2, ForkStatus::Pending)],
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn a_batch_redraws_only_the_forks_it_changed() {
        let mut view = View::new(session());
        let first = view.apply(&[snapshot()]).unwrap();
        assert!(
            first.contains("fork-1") && first.contains("fork-2"),
            "{first}"
        );
        let done = RunEvent {
            kind: Kind::ForkFinished as i32,
            fork: 2,
            fork_result: Some(fork(2, ForkStatus::Succeeded)),
            ..Default::default()
        };
        let patch = view.apply(&[done]).unwrap();
        let v: serde_json::Value = serde_json::from_str(&patch).unwrap();
        assert!(v["html"]["fork-2"].as_str().unwrap().contains("succeeded"));
        assert!(v["html"].get("fork-1").is_none(), "{patch}");
        assert!(
            v["html"]["run-summary"]
                .as_str()
                .unwrap()
                .contains("1 succeeded")
        );
    }

    #[test]
    fn nothing_before_a_snapshot_and_unknown_forks_are_ignored() {
        let mut view = View::new(session());
        let stray = RunEvent {
            kind: Kind::ForkStarted as i32,
            fork: 9,
            fork_result: Some(fork(9, ForkStatus::Running)),
            ..Default::default()
        };
        assert!(view.apply(std::slice::from_ref(&stray)).is_none());
        view.apply(&[snapshot()]);
        let patch = view.apply(&[stray]).unwrap_or_default();
        assert!(!patch.contains("fork-9"), "{patch}");
    }
}
