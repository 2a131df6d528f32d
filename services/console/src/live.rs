//! `/runs/<id>/events`: the run page kept live. The gateway's `WatchRun` events are
//! gathered for a short window and applied to the run as the page drew it; each batch
//! becomes one Server-Sent Event `patch` carrying the redrawn fork rows and summary
//! (server-rendered, escaped HTML by element id), so a busy run costs the browser one
//! redraw per window, not one per event. New forks (branches) come as `rows`, appended
//! when the page has no row for them yet. The cost chart and the fork tree are redrawn
//! with the summary.
//!
//! `end` only when the run has finished. A watch that breaks off before that (the
//! gateway restarting) ends the event stream without it, and a gateway that cannot be
//! reached when the page connects gets an empty stream: both carry a `retry:` so the
//! browser's EventSource connects again by itself, and the new watch's snapshot
//! redraws every row.

use crate::{
    AppState, ConsoleError, chart, fork_tree, format, gateway, run_page, session::Session,
};
use axum::{
    Extension,
    extract::{Path, State},
    response::{
        IntoResponse, Response,
        sse::{Event, KeepAlive, Sse},
    },
};
use forkyard_proto::common::v1::ForkResult;
use forkyard_proto::gateway::v1::{Run, RunEvent, WatchRunRequest, run_event::Kind};
use futures::StreamExt as _;
use std::{
    collections::{BTreeMap, BTreeSet},
    convert::Infallible,
    time::Duration,
};

/// How long events are gathered before the page is told.
const BATCH_WINDOW: Duration = Duration::from_millis(250);
const BATCH_MAX: usize = 512;
/// How long the browser waits before connecting again after the stream ends early.
const RETRY: Duration = Duration::from_secs(2);

pub async fn events(
    State(state): State<AppState>,
    Extension(session): Extension<Session>,
    Path(run_id): Path<String>,
) -> Result<Response, ConsoleError> {
    let req = WatchRunRequest {
        run_id: run_id.clone(),
    };
    let hello = Event::default().retry(RETRY).comment("live");
    let watch = match state
        .gateway
        .client()
        .watch_run(gateway::request(session.key.as_ref(), req)?)
        .await
    {
        Ok(w) => w.into_inner(),
        // The gateway away (restarting): an empty stream that asks to be tried again,
        // where an error status would make the browser give up.
        Err(s) if s.code() == tonic::Code::Unavailable => {
            tracing::info!(run_id, error = %s.message(), "watch not started: the gateway is unavailable; the page retries");
            let stream = futures::stream::iter([hello, waiting()].map(Ok::<_, Infallible>));
            return Ok(Sse::new(stream).into_response());
        }
        Err(s) => return Err(s.into()),
    };
    let mut view = View::new(session);
    let batches = tokio_stream::StreamExt::chunks_timeout(watch, BATCH_MAX, BATCH_WINDOW);
    let patches = batches.map(move |batch| {
        let failed = batch.iter().any(Result::is_err);
        let events: Vec<RunEvent> = batch.into_iter().map_while(Result::ok).collect();
        let patch = view.apply(&events);
        let mut out: Vec<Result<Event, Infallible>> = Vec::new();
        if let Some(json) = patch {
            out.push(Ok(Event::default().event("patch").data(json)));
        }
        if view.finished() {
            out.push(Ok(Event::default().event("end").data("finished")));
        } else if failed {
            out.push(Ok(waiting()));
        }
        futures::stream::iter(out)
    });
    let stream = futures::stream::once(async move { Ok(hello) }).chain(patches.flatten());
    // Comments well inside the listener's idle timeout keep a quiet run's stream open.
    let sse = Sse::new(stream).keep_alive(KeepAlive::new().interval(Duration::from_secs(15)));
    Ok(sse.into_response())
}

/// The watch ended before the run: the page says so until the browser reconnects.
fn waiting() -> Event {
    Event::default()
        .event("waiting")
        .data("the gateway's watch ended; reconnecting")
}

/// The run as the watch has told it so far.
pub struct View {
    run: Option<Run>,
    /// The watcher's session: the forms in rows and summary carry its CSRF token.
    session: Session,
    finished: bool,
}

/// What a batch changed.
#[derive(Default)]
struct Changed {
    forks: BTreeSet<u32>,
    summary: bool,
}

impl View {
    pub fn new(session: Session) -> Self {
        Self {
            run: None,
            session,
            finished: false,
        }
    }

    /// The watch told the run's end: nothing more will come.
    pub fn finished(&self) -> bool {
        self.finished
    }

    /// Applies a batch; the JSON of the elements to redraw (`html`: id → HTML to
    /// replace; `rows`: fork rows to replace, or append when the page has none), or
    /// `None` when nothing visible changed.
    pub fn apply(&mut self, events: &[RunEvent]) -> Option<String> {
        let mut changed = Changed::default();
        for ev in events {
            match (Kind::try_from(ev.kind), ev.run.as_ref()) {
                // A state change carries the run too (its budget after a raise).
                (Ok(Kind::Snapshot | Kind::RunFinished | Kind::RunStateChanged), Some(run)) => {
                    self.finished |= ev.kind == Kind::RunFinished as i32
                        || (ev.kind == Kind::Snapshot as i32 && !format::run_live(run.state));
                    self.run = Some(run.clone());
                    changed.forks.extend(run.forks.iter().map(|f| f.fork));
                    changed.summary = true;
                }
                _ => self.apply_one(ev, &mut changed),
            }
        }
        let run = self.run.as_ref()?;
        let now = format::now_ms();
        let rows: BTreeMap<String, String> = changed
            .forks
            .iter()
            .filter_map(|n| run.forks.get(n.checked_sub(1)? as usize))
            .map(|f| {
                let row = run_page::fork_row(run, f, now, &self.session);
                (format!("fork-{}", f.fork), row.0)
            })
            .collect();
        let mut html = BTreeMap::new();
        if changed.summary || !rows.is_empty() {
            html.insert("run-summary", run_page::summary(run, &self.session).0);
            html.insert("cost-chart", chart::render(run, now).0);
            let tree = fork_tree::render(run).0;
            if !tree.is_empty() {
                html.insert("fork-tree", tree);
            }
        }
        (!html.is_empty() || !rows.is_empty())
            .then(|| serde_json::json!({ "html": html, "rows": rows }).to_string())
    }

    /// One fork or state event.
    fn apply_one(&mut self, ev: &RunEvent, changed: &mut Changed) {
        let Some(run) = self.run.as_mut() else {
            return;
        };
        if let Ok(Kind::RunStateChanged) = Kind::try_from(ev.kind) {
            run.state = ev.state;
            changed.summary = true;
            return;
        }
        let Some(result) = ev.fork_result.as_ref() else {
            return;
        };
        let Some(i) = (ev.fork as usize).checked_sub(1) else {
            return;
        };
        // A branch's fork is numbered after the run's existing ones; a number far past
        // them is not a fork of this run.
        if i >= run.forks.len() + MAX_NEW_FORKS {
            return;
        }
        while run.forks.len() <= i {
            let fork = run.forks.len() as u32 + 1;
            run.forks.push(ForkResult {
                fork,
                status: forkyard_proto::common::v1::ForkStatus::Pending as i32,
                ..Default::default()
            });
            changed.forks.insert(fork);
        }
        run.forks[i] = result.clone();
        changed.forks.insert(ev.fork);
        recount(run);
        changed.summary = true;
    }
}

/// Most forks a batch may add past the run's last (BranchFork's count is bounded by the
/// gateway's fork limit; this only bounds what a bad event could make the page draw).
const MAX_NEW_FORKS: usize = 1_000;

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
    use forkyard_proto::gateway::v1::RunState;

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
                state: RunState::Running as i32,
                forks: vec![fork(1, ForkStatus::Running), fork(2, ForkStatus::Pending)],
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn patch(view: &mut View, events: &[RunEvent]) -> serde_json::Value {
        serde_json::from_str(&view.apply(events).expect("a patch")).unwrap()
    }

    fn finished(n: u32, status: ForkStatus) -> RunEvent {
        RunEvent {
            kind: Kind::ForkFinished as i32,
            fork: n,
            fork_result: Some(fork(n, status)),
            ..Default::default()
        }
    }

    #[test]
    fn a_batch_redraws_only_the_forks_it_changed() {
        let mut view = View::new(session());
        let first = patch(&mut view, &[snapshot()]);
        assert!(first["rows"]["fork-1"].is_string() && first["rows"]["fork-2"].is_string());
        assert!(
            first["html"]["cost-chart"]
                .as_str()
                .unwrap()
                .contains("<svg")
        );
        let v = patch(&mut view, &[finished(2, ForkStatus::Succeeded)]);
        assert!(v["rows"]["fork-2"].as_str().unwrap().contains("succeeded"));
        assert!(v["rows"].get("fork-1").is_none(), "{v}");
        let summary = v["html"]["run-summary"].as_str().unwrap();
        assert!(summary.contains("1 succeeded"), "{summary}");
        assert!(!view.finished());
    }

    #[test]
    fn nothing_before_a_snapshot_and_forks_far_past_the_run_are_ignored() {
        let mut view = View::new(session());
        let stray = finished(5_000, ForkStatus::Running);
        assert!(view.apply(std::slice::from_ref(&stray)).is_none());
        view.apply(&[snapshot()]);
        let patch = view.apply(&[stray]).unwrap_or_default();
        assert!(!patch.contains("fork-5000"), "{patch}");
    }

    #[test]
    fn branches_add_rows_and_draw_the_tree() {
        let mut view = View::new(session());
        view.apply(&[snapshot()]);
        let mut branch = finished(4, ForkStatus::Running);
        if let Some(f) = branch.fork_result.as_mut() {
            f.parent_fork = 1;
            f.depth = 1;
        }
        let v = patch(&mut view, &[branch]);
        // Fork 3 not heard of yet: pending until it is.
        assert!(
            v["rows"]["fork-3"].as_str().unwrap().contains("pending"),
            "{v}"
        );
        assert!(
            v["rows"]["fork-4"].as_str().unwrap().contains("running"),
            "{v}"
        );
        assert!(
            v["html"]["fork-tree"]
                .as_str()
                .unwrap()
                .contains("data-fork=\"4\""),
            "{v}"
        );
    }

    #[test]
    fn a_state_change_brings_the_budget_and_the_end_is_told() {
        let mut view = View::new(session());
        view.apply(&[snapshot()]);
        let mut raised = snapshot();
        raised.kind = Kind::RunStateChanged as i32;
        if let Some(r) = raised.run.as_mut() {
            r.state = RunState::Paused as i32;
            r.budget_micros = 7_000_000;
        }
        let v = patch(&mut view, &[raised]);
        let summary = v["html"]["run-summary"].as_str().unwrap();
        assert!(
            summary.contains("$7.00") && summary.contains("Resume"),
            "{summary}"
        );
        let mut end = snapshot();
        end.kind = Kind::RunFinished as i32;
        view.apply(&[end]);
        assert!(view.finished());
    }
}
