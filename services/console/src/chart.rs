//! The run's cost over time, drawn by the server as an SVG (no script, no library).
//!
//! What is plotted: the run's settled cost, a step up at each fork's finish by that
//! fork's cost (`ForkResult.finished_unix_ms` and `cost_micros`, which `GetRun` and
//! every `WatchRun` fork event carry), from the run's start to its end (or now). A
//! running fork's spend is not settled yet: the gap between the run's cost
//! (`Run.cost_micros`, which counts what running forks were charged) and the settled
//! sum is drawn as a dashed rise at the right edge. The budget is a horizontal line
//! when it fits the scale (a budget far above the spend would flatten the curve, so it
//! is then only named).

use crate::format;
use forkyard_proto::gateway::v1::Run;
use maud::{Markup, html};

const W: f64 = 600.0;
const H: f64 = 160.0;
/// Room for the labels left of and under the plot.
const LEFT: f64 = 64.0;
const BOTTOM: f64 = 20.0;
const TOP: f64 = 8.0;

/// Settled cost after each fork's finish: (unix ms, cumulative micros), in time order.
pub fn settled(run: &Run) -> Vec<(i64, i64)> {
    let mut done: Vec<(i64, i64)> = run
        .forks
        .iter()
        .filter(|f| f.finished_unix_ms > 0 && format::fork_done(f.status))
        .map(|f| (f.finished_unix_ms, f.cost_micros.max(0)))
        .collect();
    done.sort_unstable();
    let mut sum = 0;
    done.into_iter()
        .map(|(t, c)| {
            sum += c;
            (t, sum)
        })
        .collect()
}

/// The chart (id `cost-chart`), redrawn live with the summary.
pub fn render(run: &Run, now: i64) -> Markup {
    let points = settled(run);
    let settled_total = points.last().map_or(0, |p| p.1);
    let total = run.cost_micros.max(settled_total);
    let budget = run.budget_micros.max(0);
    let start = if run.started_unix_ms > 0 {
        run.started_unix_ms
    } else {
        points.first().map_or(now, |p| p.0)
    };
    let end = if run.finished_unix_ms > 0 {
        run.finished_unix_ms
    } else {
        now
    }
    .max(start + 1);
    // The budget is on the scale unless it would squash the spend into the bottom quarter.
    // Nothing spent yet: the budget is the only scale there is.
    let budget_shown = budget > 0 && (total == 0 || budget <= total.saturating_mul(4));
    let scale = if budget_shown {
        budget.max(total)
    } else {
        total
    }
    .max(1);
    let top = scale as f64 * 1.1;
    let x = |t: i64| {
        LEFT + (t - start).clamp(0, end - start) as f64 / (end - start) as f64 * (W - LEFT - 4.0)
    };
    let y = |c: i64| TOP + (H - TOP - BOTTOM) * (1.0 - c as f64 / top);
    let steps = step_path(&points, start, end, &x, &y);
    let label = format!(
        "Settled cost {} of {} budget over {}; {} forks settled",
        format::usd(settled_total),
        format::usd(budget),
        format::duration_ms(u64::try_from(end - start).unwrap_or(0)),
        points.len()
    );
    html! {
        figure #cost-chart .chart {
            svg viewBox=(format!("0 0 {W} {H}")) role="img" aria-label=(label) preserveAspectRatio="none" {
                title { (label) }
                line.axis x1=(LEFT) y1=(y(0)) x2=(W - 4.0) y2=(y(0)) {}
                line.axis x1=(LEFT) y1=(TOP) x2=(LEFT) y2=(y(0)) {}
                text.tick x=(LEFT - 4.0) y=(y(0)) text-anchor="end" { "$0" }
                text.tick x=(LEFT - 4.0) y=(TOP + 10.0) text-anchor="end" { (format::usd(scale)) }
                @if budget_shown {
                    line.budget x1=(LEFT) y1=(y(budget)) x2=(W - 4.0) y2=(y(budget)) {}
                }
                path.area d=(format!("{steps} L {:.1} {:.1} L {LEFT:.1} {:.1} Z", x(end), y(0), y(0))) {}
                path.spend d=(steps) {}
                @if total > settled_total {
                    path.inflight d=(format!("M {:.1} {:.1} L {:.1} {:.1}", x(end), y(settled_total), x(end), y(total))) {}
                }
                text.tick x=(LEFT) y=(H - 4.0) { "start" }
                text.tick x=(W - 4.0) y=(H - 4.0) text-anchor="end" {
                    "+" (format::duration_ms(u64::try_from(end - start).unwrap_or(0)))
                }
            }
            figcaption {
                "Settled cost " (format::usd(settled_total))
                @if total > settled_total { " (" (format::usd(total)) " with running forks)" }
                " · budget " (format::usd(budget))
                @if !budget_shown && budget > 0 { " (above the chart's scale)" }
            }
        }
    }
}

/// `M … H … V …`: flat until each settle, then up by its cost.
fn step_path(
    points: &[(i64, i64)],
    start: i64,
    end: i64,
    x: &impl Fn(i64) -> f64,
    y: &impl Fn(i64) -> f64,
) -> String {
    let mut d = format!("M {:.1} {:.1}", x(start), y(0));
    for &(t, c) in points {
        d.push_str(&format!(" H {:.1} V {:.1}", x(t), y(c)));
    }
    d.push_str(&format!(" H {:.1}", x(end)));
    d
}

#[cfg(test)]
mod tests {
    use super::*;
    use forkyard_proto::common::v1::{ForkResult, ForkStatus};

    fn fork(n: u32, finished: i64, cost: i64, status: ForkStatus) -> ForkResult {
        ForkResult {
            fork: n,
            status: status as i32,
            finished_unix_ms: finished,
            cost_micros: cost,
            ..Default::default()
        }
    }

    fn run() -> Run {
        Run {
            started_unix_ms: 1_000,
            budget_micros: 100,
            cost_micros: 60,
            forks: vec![
                fork(1, 5_000, 20, ForkStatus::Succeeded),
                fork(2, 3_000, 10, ForkStatus::Failed),
                fork(3, 0, 0, ForkStatus::Running),
            ],
            ..Default::default()
        }
    }

    #[test]
    fn settles_in_time_order_and_sums() {
        assert_eq!(settled(&run()), vec![(3_000, 10), (5_000, 30)]);
    }

    #[test]
    fn draws_steps_budget_and_the_running_part() {
        let svg = render(&run(), 11_000).into_string();
        assert!(svg.contains("class=\"spend\""), "{svg}");
        assert!(svg.contains("class=\"budget\""), "{svg}");
        assert!(svg.contains("class=\"inflight\""), "{svg}");
        // Start at x=64, first settle a fifth of the way along the plot.
        assert!(svg.contains("M 64.0 "), "{svg}");
        assert!(svg.contains("Settled cost $0.00"), "{svg}");
    }

    #[test]
    fn an_empty_run_still_draws_and_a_huge_budget_is_only_named() {
        let mut r = Run::default();
        assert!(render(&r, 5).into_string().contains("<path"));
        r.budget_micros = 1_000_000;
        assert!(render(&r, 5).into_string().contains("class=\"budget\""));
        r.budget_micros = 1_000_000;
        r.cost_micros = 10;
        let svg = render(&r, 5).into_string();
        assert!(!svg.contains("class=\"budget\""), "{svg}");
        assert!(svg.contains("above the chart"), "{svg}");
    }
}
