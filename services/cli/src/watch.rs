//! `watch` and `fork --wait`: follow a run's WatchRun stream. On a terminal a live
//! line per fork (redrawn in place); otherwise one line per event, for logs.

use crate::{
    commands::{Client, status_error},
    table,
};
use forkyard_proto::gateway::v1::{GetRunRequest, Run, RunEvent, WatchRunRequest, run_event::Kind};
use std::io::{IsTerminal, Write};

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

    fn draw(&mut self, out: &mut impl Write) {
        if self.drawn > 0 {
            let _ = write!(out, "\x1b[{}A", self.drawn);
        }
        for l in &self.lines {
            let _ = writeln!(out, "\x1b[2K{l}");
        }
        self.drawn = self.lines.len();
        let _ = out.flush();
    }
}

/// Follow the run until it finishes; the final run.
pub async fn follow(client: &mut Client, run_id: &str, human: bool) -> anyhow::Result<Run> {
    let mut stream = client
        .watch_run(WatchRunRequest {
            run_id: run_id.to_owned(),
        })
        .await
        .map_err(status_error)?
        .into_inner();
    let tty = human && std::io::stderr().is_terminal();
    let mut live: Option<Live> = None;
    let mut err = std::io::stderr();
    while let Some(e) = stream.message().await.map_err(status_error)? {
        let kind = Kind::try_from(e.kind).unwrap_or_default();
        if kind == Kind::Snapshot
            && let Some(run) = &e.run
        {
            live = Some(Live::new(run));
        }
        if kind == Kind::RunFinished {
            if let Some(run) = e.run {
                if let Some(l) = live.as_mut().filter(|_| tty) {
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
                return Ok(run);
            }
            break;
        }
        if !human {
            continue;
        }
        if tty {
            if let Some(l) = live.as_mut() {
                l.apply(&e);
                l.draw(&mut err);
            }
        } else if kind != Kind::Snapshot {
            let _ = writeln!(err, "{}", table::event_line(&e));
        }
    }
    // The stream ended without a final event (gateway restart): read the run instead.
    Ok(client
        .get_run(GetRunRequest {
            run_id: run_id.to_owned(),
        })
        .await
        .map_err(status_error)?
        .into_inner())
}
