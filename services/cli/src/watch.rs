//! `watch` and `fork --wait`: follow a run's WatchRun stream. On a terminal a live
//! line per fork (`live`); otherwise one line per event, for logs.

use crate::{
    client::{Client, status_error},
    live::Live,
    table,
};
use forkyard_proto::gateway::v1::{GetRunRequest, Run, RunState, WatchRunRequest, run_event::Kind};
use std::{
    io::{IsTerminal, Write},
    time::{Duration, Instant},
};
use tonic::Code;

/// The terminal's rows (stderr's), 24 when it cannot say.
fn terminal_rows() -> usize {
    rustix::termios::tcgetwinsize(std::io::stderr())
        .ok()
        .filter(|w| w.ws_row > 0)
        .map_or(24, |w| usize::from(w.ws_row))
}

/// How long `watch` keeps trying to reach the gateway again before it gives up.
const RECONNECT_FOR: Duration = Duration::from_secs(300);

/// A failure worth reconnecting after: the gateway restarting, a dropped connection, a
/// proxy timing the stream out. Anything else (not found, refused) is the answer.
fn transient(s: &tonic::Status) -> bool {
    matches!(
        s.code(),
        Code::Unavailable
            | Code::Unknown
            | Code::Internal
            | Code::DeadlineExceeded
            | Code::Aborted
            | Code::Cancelled
    )
}

fn finished(run: &Run) -> bool {
    !matches!(
        RunState::try_from(run.state).unwrap_or_default(),
        RunState::Unspecified | RunState::Running | RunState::Paused | RunState::AwaitingBudget
    )
}

/// Follow the run until it finishes; the final run. A stream that drops (a gateway
/// restarted, a connection cut) is opened again, with backoff, for up to
/// [`RECONNECT_FOR`] without an answer; each new stream starts with a snapshot, so
/// nothing said meanwhile is missed.
pub async fn follow(client: &mut Client, run_id: &str, human: bool) -> anyhow::Result<Run> {
    let tty = human && std::io::stderr().is_terminal();
    let mut view = View {
        live: None,
        human,
        tty,
    };
    let mut unreachable_since: Option<Instant> = None;
    // Jittered (backon, the mesh's one retry crate): every terminal watching a gateway
    // that restarts reconnects, and not all at once.
    let mut delays = backon::BackoffBuilder::build(
        backon::ExponentialBuilder::default()
            .with_min_delay(Duration::from_millis(250))
            .with_max_delay(Duration::from_secs(5))
            .with_jitter()
            .without_max_times(),
    );
    loop {
        let why = match stream_once(client, run_id, &mut view).await {
            Ok(Some(run)) => return Ok(run),
            Ok(None) => "the stream ended".to_owned(),
            Err(s) if !transient(&s) => return Err(status_error(s)),
            Err(s) => format!("{}: {}", s.code().description(), s.message()),
        };
        // It may have finished meanwhile (a restarted gateway ends its streams).
        let get = GetRunRequest {
            run_id: run_id.to_owned(),
        };
        match client.get_run(get).await {
            Ok(r) if finished(r.get_ref()) => return Ok(r.into_inner()),
            Ok(_) => unreachable_since = None,
            Err(s) if !transient(&s) => return Err(status_error(s)),
            Err(s) => {
                let since = *unreachable_since.get_or_insert_with(Instant::now);
                if since.elapsed() >= RECONNECT_FOR {
                    return Err(anyhow::anyhow!(
                        "lost the gateway's stream of run {run_id} ({why}) and could not reach it again for {} s: {}",
                        RECONNECT_FOR.as_secs(),
                        s.message()
                    ));
                }
            }
        }
        if human && !tty {
            eprintln!("watch: {why}; reconnecting");
        }
        tokio::time::sleep(delays.next().unwrap_or(Duration::from_secs(5))).await;
    }
}

/// What the watch shows, across reconnects.
struct View {
    live: Option<Live>,
    human: bool,
    tty: bool,
}

/// One WatchRun stream: the final run if it said the run finished, `None` if it ended
/// without saying so.
async fn stream_once(
    client: &mut Client,
    run_id: &str,
    view: &mut View,
) -> Result<Option<Run>, tonic::Status> {
    let mut stream = client
        .watch_run(WatchRunRequest {
            run_id: run_id.to_owned(),
        })
        .await?
        .into_inner();
    let mut err = std::io::stderr();
    while let Some(e) = stream.message().await? {
        let kind = Kind::try_from(e.kind).unwrap_or_default();
        if kind == Kind::Snapshot
            && view.tty
            && let Some(run) = &e.run
        {
            // A reconnect's snapshot updates the lines the last stream drew.
            match view.live.as_mut() {
                Some(live) => live.show_run(run),
                None => view.live = Some(Live::new(run, terminal_rows())),
            }
        }
        if kind == Kind::RunFinished {
            if let Some(run) = e.run {
                if let Some(l) = view.live.as_mut() {
                    l.show_run(&run);
                    l.finish();
                }
                return Ok(Some(run));
            }
            return Ok(None);
        }
        if !view.human {
            continue;
        }
        if view.tty {
            if let Some(l) = view.live.as_mut() {
                l.apply(&e);
            }
        } else if kind != Kind::Snapshot {
            let _ = writeln!(err, "{}", table::event_line(&e));
        }
    }
    Ok(None)
}
