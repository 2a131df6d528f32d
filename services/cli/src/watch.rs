//! `watch` and `fork --wait`: follow a run's WatchRun stream. On a terminal a live
//! line per fork (redrawn in place); otherwise one line per event, for logs.

use crate::{
    client::{Client, status_error},
    table,
};
use forkyard_proto::gateway::v1::{
    GetRunRequest, Run, RunEvent, RunState, WatchRunRequest, run_event::Kind,
};
use std::{
    io::{IsTerminal, Write},
    time::{Duration, Instant},
};
use tonic::Code;

fn bar(done_ms: u64, limit_ms: u64, width: usize) -> String {
    let filled = (done_ms.min(limit_ms) * width as u64)
        .checked_div(limit_ms)
        .map_or(0, |f| f as usize);
    format!("[{}{}]", "#".repeat(filled), ".".repeat(width - filled))
}

struct Live {
    lines: Vec<String>,
    drawn: usize,
    timeout_ms: u64,
}

impl Live {
    fn new(run: &Run) -> Self {
        let timeout_ms = run.spec.as_ref().map_or(600, |s| s.fork_timeout_secs) as u64 * 1000;
        let lines = run
            .forks
            .iter()
            .map(|f| format!("fork {:>3}  {}", f.fork, table::fork_status(f.status)))
            .collect();
        Self {
            lines,
            drawn: 0,
            timeout_ms,
        }
    }

    fn apply(&mut self, e: &RunEvent) {
        let Some(f) = &e.fork_result else { return };
        let Some(line) = self.lines.get_mut((e.fork as usize).wrapping_sub(1)) else {
            return;
        };
        *line = match Kind::try_from(e.kind).unwrap_or_default() {
            Kind::AgentProgress => format!(
                "fork {:>3}  {:<16} {} {:>6.1}s  {}  {}",
                e.fork,
                "running agent",
                bar(e.agent_elapsed_ms, self.timeout_ms, 20),
                e.agent_elapsed_ms as f64 / 1000.0,
                table::usd(e.agent_cost_micros),
                e.agent_last_action
            ),
            Kind::ForkFinished => format!(
                "fork {:>3}  {:<16} {}  {}",
                e.fork,
                table::fork_status(f.status),
                table::usd(f.cost_micros),
                table::diffstat(f)
            ),
            _ => format!(
                "fork {:>3}  {}",
                e.fork,
                if f.phase.is_empty() {
                    table::fork_status(f.status)
                } else {
                    &f.phase
                }
            ),
        };
    }

    /// Redraw in place. Each line is cut to the terminal's width and at most its height
    /// less one line is drawn (the rest summed up in the last), so the cursor always goes
    /// back up exactly over what was drawn: a wrapped line or a view taller than the
    /// screen would leave the redraw off by some lines and smear the screen.
    fn draw(&mut self, out: &mut impl Write) {
        let (cols, rows) = terminal_size();
        if self.drawn > 0 {
            let _ = write!(out, "\x1b[{}A", self.drawn);
        }
        let lines = fit(&self.lines, cols, rows);
        for l in &lines {
            let _ = writeln!(out, "\x1b[2K{l}");
        }
        // A view that shrank (a smaller terminal) clears what it drew before.
        for _ in lines.len()..self.drawn {
            let _ = writeln!(out, "\x1b[2K");
        }
        self.drawn = lines.len().max(self.drawn);
        let _ = out.flush();
    }
}

/// The terminal's columns and rows (stderr's), 80×24 when it cannot say.
fn terminal_size() -> (usize, usize) {
    rustix::termios::tcgetwinsize(std::io::stderr())
        .ok()
        .filter(|w| w.ws_col > 0 && w.ws_row > 0)
        .map_or((80, 24), |w| (usize::from(w.ws_col), usize::from(w.ws_row)))
}

/// The lines that fit `cols` × `rows`: each cut short of the width (one column spare,
/// so no terminal wraps), and past `rows - 1` lines one that says how many more.
fn fit(lines: &[String], cols: usize, rows: usize) -> Vec<String> {
    let cut = |l: &str| -> String {
        let width = cols.saturating_sub(1).max(1);
        if l.chars().count() <= width {
            l.to_owned()
        } else {
            let mut s: String = l.chars().take(width.saturating_sub(1)).collect();
            s.push('…');
            s
        }
    };
    let room = rows.saturating_sub(1).max(2);
    if lines.len() <= room {
        return lines.iter().map(|l| cut(l)).collect();
    }
    let shown = room - 1;
    let mut out: Vec<String> = lines[..shown].iter().map(|l| cut(l)).collect();
    out.push(cut(&format!(
        "… and {} more forks (forkyard status for all)",
        lines.len() - shown
    )));
    out
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
    let mut delay = Duration::from_millis(250);
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
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_secs(5));
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
            && let Some(run) = &e.run
        {
            // A reconnect's snapshot redraws over what the last stream drew.
            let drawn = view.live.as_ref().map_or(0, |l| l.drawn);
            let mut live = Live::new(run);
            live.drawn = drawn;
            view.live = Some(live);
        }
        if kind == Kind::RunFinished {
            if let Some(run) = e.run {
                if let Some(l) = view.live.as_mut().filter(|_| view.tty) {
                    for f in &run.forks {
                        let ev = RunEvent {
                            kind: Kind::ForkFinished as i32,
                            fork: f.fork,
                            fork_result: Some(f.clone()),
                            ..Default::default()
                        };
                        l.apply(&ev);
                    }
                    l.draw(&mut err);
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
                l.draw(&mut err);
            }
        } else if kind != Kind::Snapshot {
            let _ = writeln!(err, "{}", table::event_line(&e));
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::fit;

    #[test]
    fn long_lines_are_cut_to_the_width() {
        let lines = vec!["x".repeat(200), "short".into()];
        let out = fit(&lines, 40, 24);
        assert_eq!(out.len(), 2);
        assert_eq!(out[0].chars().count(), 39);
        assert!(out[0].ends_with('…'));
        assert_eq!(out[1], "short");
    }

    #[test]
    fn more_forks_than_rows_end_in_a_summary_line() {
        let lines: Vec<String> = (1..=100).map(|n| format!("fork {n}")).collect();
        let out = fit(&lines, 80, 24);
        assert_eq!(
            out.len(),
            23,
            "never the whole screen: the cursor must get back up"
        );
        assert_eq!(out[21], "fork 22");
        assert_eq!(out[22], "… and 78 more forks (forkyard status for all)");
    }
}
