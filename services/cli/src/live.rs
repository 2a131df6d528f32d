//! The live view of `watch` on a terminal: a line per fork, drawn by indicatif. Each
//! line is cut to the terminal's width (`wide_msg`), and a run with more forks than the
//! terminal has rows shows the first ones and a last line that sums up the rest, so the
//! view never scrolls and a redraw never lands off by some lines.

use crate::table;
use forkyard_proto::{
    common::v1::{ForkResult, ForkStatus},
    gateway::v1::{Run, RunEvent, run_event::Kind},
};
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::collections::BTreeMap;

/// A line of a fork that is not running its agent: its number and what it is doing.
const PLAIN: &str = "fork {prefix:>3}  {wide_msg}";
/// A fork's agent at work: how much of its time limit it used, cost, last action.
const AGENT: &str = "fork {prefix:>3}  running agent    [{bar:20}] {wide_msg}";

pub(crate) struct Live {
    /// One line per shown fork: the first ones, as many as fit.
    bars: Vec<ProgressBar>,
    /// The forks that do not fit, summed up by status.
    more: Option<ProgressBar>,
    status: Vec<i32>,
    timeout_ms: u64,
}

impl Live {
    /// The view of `run` on stderr, sized to the terminal's `rows`.
    pub(crate) fn new(run: &Run, rows: usize) -> Self {
        Self::with_target(run, rows, ProgressDrawTarget::stderr())
    }

    pub(crate) fn with_target(run: &Run, rows: usize, target: ProgressDrawTarget) -> Self {
        let multi = MultiProgress::with_draw_target(target);
        let timeout_ms = u64::from(run.spec.as_ref().map_or(600, |s| s.fork_timeout_secs)) * 1000;
        // One row stays free for the cursor; past that, a row sums up the rest.
        let room = rows.saturating_sub(1).max(2);
        let shown = if run.forks.len() <= room {
            run.forks.len()
        } else {
            room - 1
        };
        let bars = run.forks[..shown]
            .iter()
            .map(|f| {
                let bar = multi.add(ProgressBar::new(timeout_ms.max(1)));
                bar.set_style(style(PLAIN));
                bar.set_prefix(f.fork.to_string());
                bar.set_message(table::fork_status(f.status));
                bar
            })
            .collect();
        let more = (shown < run.forks.len()).then(|| {
            let bar = multi.add(ProgressBar::new(1));
            bar.set_style(style("{wide_msg}"));
            bar
        });
        let mut live = Self {
            bars,
            more,
            status: run.forks.iter().map(|f| f.status).collect(),
            timeout_ms,
        };
        live.sum_up_the_rest();
        live
    }

    /// Every fork as `run` has it (a reconnect's snapshot, or the run's end).
    pub(crate) fn show_run(&mut self, run: &Run) {
        for f in &run.forks {
            self.apply(&RunEvent {
                kind: Kind::Unspecified as i32,
                fork: f.fork,
                fork_result: Some(f.clone()),
                ..Default::default()
            });
        }
    }

    pub(crate) fn apply(&mut self, e: &RunEvent) {
        let Some(f) = &e.fork_result else { return };
        let i = (e.fork as usize).wrapping_sub(1);
        if let Some(s) = self.status.get_mut(i) {
            *s = f.status;
        }
        let kind = Kind::try_from(e.kind).unwrap_or_default();
        if let Some(bar) = self.bars.get(i) {
            match kind {
                Kind::AgentProgress => {
                    bar.set_style(style(AGENT));
                    bar.set_position(e.agent_elapsed_ms.min(self.timeout_ms));
                    bar.set_message(format!(
                        "{:>6.1}s  {}  {}",
                        e.agent_elapsed_ms as f64 / 1000.0,
                        table::usd(e.agent_cost_micros),
                        e.agent_last_action
                    ));
                }
                _ => {
                    bar.set_style(style(PLAIN));
                    bar.set_message(line(f, kind));
                }
            }
        }
        self.sum_up_the_rest();
    }

    /// Leave the final view on the screen.
    pub(crate) fn finish(&self) {
        for bar in self.bars.iter().chain(&self.more) {
            bar.abandon();
        }
    }

    fn sum_up_the_rest(&mut self) {
        let Some(more) = &self.more else { return };
        let rest = &self.status[self.bars.len()..];
        let mut by_status: BTreeMap<&str, usize> = BTreeMap::new();
        for s in rest {
            *by_status.entry(table::fork_status(*s)).or_default() += 1;
        }
        let counts: Vec<String> = by_status.iter().map(|(s, n)| format!("{n} {s}")).collect();
        more.set_message(format!(
            "… and {} more forks ({}); forkyard status for all",
            rest.len(),
            counts.join(", ")
        ));
    }
}

fn style(template: &str) -> ProgressStyle {
    ProgressStyle::with_template(template)
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("#>.")
}

/// A fork's line outside its agent: finished (status, cost, diffstat), or its phase.
fn line(f: &ForkResult, kind: Kind) -> String {
    let done = kind == Kind::ForkFinished
        || !matches!(
            ForkStatus::try_from(f.status).unwrap_or_default(),
            ForkStatus::Pending | ForkStatus::Running | ForkStatus::Unspecified
        );
    if done {
        format!(
            "{:<16} {}  {}",
            table::fork_status(f.status),
            table::usd(f.cost_micros),
            table::diffstat(f)
        )
    } else if f.phase.is_empty() {
        table::fork_status(f.status).to_owned()
    } else {
        f.phase.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use forkyard_proto::gateway::v1::RunSpec;
    use indicatif::InMemoryTerm;

    fn run(forks: u32) -> Run {
        Run {
            spec: Some(RunSpec {
                fork_timeout_secs: 60,
                ..Default::default()
            }),
            forks: (1..=forks)
                .map(|fork| ForkResult {
                    fork,
                    status: ForkStatus::Pending as i32,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    fn progress(fork: u32, action: &str) -> RunEvent {
        RunEvent {
            kind: Kind::AgentProgress as i32,
            fork,
            agent_elapsed_ms: 30_000,
            agent_cost_micros: 12_345,
            agent_last_action: action.to_owned(),
            fork_result: Some(ForkResult {
                fork,
                status: ForkStatus::Running as i32,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// What a terminal of `rows` × `cols` shows after `events` on `forks` forks.
    fn screen(forks: u32, rows: u16, cols: u16, events: &[RunEvent]) -> Vec<String> {
        let term = InMemoryTerm::new(rows, cols);
        let target = ProgressDrawTarget::term_like(Box::new(term.clone()));
        let mut live = Live::with_target(&run(forks), usize::from(rows), target);
        for e in events {
            live.apply(e);
        }
        live.finish();
        term.contents().lines().map(str::to_owned).collect()
    }

    #[test]
    fn long_lines_are_cut_to_the_width_and_never_wrap() {
        let events = [
            progress(1, &"edit src/main.rs ".repeat(20)),
            progress(2, "ok"),
        ];
        let shown = screen(3, 24, 60, &events);
        let lines: Vec<&String> = shown.iter().filter(|l| !l.trim().is_empty()).collect();
        assert_eq!(
            lines.len(),
            3,
            "one line per fork, none wrapped: {shown:#?}"
        );
        assert!(
            lines[0].starts_with("fork   1  running agent    [##########>"),
            "{shown:#?}"
        );
        assert!(lines[0].contains("30.0s"), "{shown:#?}");
        assert!(lines.iter().all(|l| l.chars().count() <= 60), "{shown:#?}");
        assert!(lines[2].starts_with("fork   3  pending"), "{shown:#?}");
    }

    #[test]
    fn more_forks_than_rows_end_in_a_summary_line() {
        let events = [progress(1, "reading"), progress(40, "writing")];
        let shown = screen(100, 24, 100, &events);
        let lines: Vec<&String> = shown.iter().filter(|l| !l.trim().is_empty()).collect();
        assert_eq!(lines.len(), 23, "never the whole screen: {shown:#?}");
        assert!(lines[21].starts_with("fork  22"), "{shown:#?}");
        assert_eq!(
            lines[22].trim_end(),
            "… and 78 more forks (77 pending, 1 running); forkyard status for all"
        );
    }

    #[test]
    fn a_finished_fork_shows_its_status_and_cost() {
        let mut done = progress(2, "");
        done.kind = Kind::ForkFinished as i32;
        done.fork_result = Some(ForkResult {
            fork: 2,
            status: ForkStatus::Succeeded as i32,
            cost_micros: 1_500_000,
            ..Default::default()
        });
        let shown = screen(2, 24, 80, &[progress(2, "x"), done]);
        let line = shown.iter().find(|l| l.starts_with("fork   2")).unwrap();
        assert!(
            line.contains(&table::fork_status(ForkStatus::Succeeded as i32).to_string()),
            "{line}"
        );
        assert!(line.contains(&table::usd(1_500_000)), "{line}");
    }
}
