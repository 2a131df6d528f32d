//! How numbers, times and states read on a page.

use forkyard_proto::{
    Usd,
    common::v1::{ForkStatus, VerifyStatus},
    gateway::v1::RunState,
};

pub fn usd(micros: i64) -> String {
    Usd::from_micros(micros).to_string()
}

/// A run state as a word ("running", "awaiting budget").
pub fn run_state(state: i32) -> String {
    RunState::try_from(state)
        .map(|s| words(s.as_str_name().trim_start_matches("RUN_STATE_")))
        .unwrap_or_else(|_| "unknown".into())
}

pub fn fork_status(status: i32) -> String {
    ForkStatus::try_from(status)
        .map(|s| words(s.as_str_name().trim_start_matches("FORK_STATUS_")))
        .unwrap_or_else(|_| "unknown".into())
}

pub fn verify(status: i32) -> String {
    match VerifyStatus::try_from(status) {
        Ok(VerifyStatus::Unspecified) | Err(_) => "—".into(),
        Ok(s) => words(s.as_str_name().trim_start_matches("VERIFY_STATUS_")),
    }
}

fn words(name: &str) -> String {
    name.to_ascii_lowercase().replace('_', " ")
}

/// Whether a fork has ended (it has a result, good or bad).
pub fn fork_done(status: i32) -> bool {
    !matches!(
        ForkStatus::try_from(status),
        Ok(ForkStatus::Pending | ForkStatus::Running | ForkStatus::Unspecified) | Err(_)
    )
}

/// Whether a run can still change (and so can be cancelled).
pub fn run_live(state: i32) -> bool {
    matches!(
        RunState::try_from(state),
        Ok(RunState::Running | RunState::Paused | RunState::AwaitingBudget)
    )
}

/// A duration in ms as a person reads it: "850 ms", "12.3 s", "4 m 05 s", "2 h 03 m".
pub fn duration_ms(ms: u64) -> String {
    match ms {
        0..1_000 => format!("{ms} ms"),
        1_000..60_000 => format!("{:.1} s", ms as f64 / 1000.0),
        60_000..3_600_000 => format!("{} m {:02} s", ms / 60_000, ms / 1000 % 60),
        _ => format!("{} h {:02} m", ms / 3_600_000, ms / 60_000 % 60),
    }
}

/// Between two instants in unix ms (`end` 0: still going, `now`); "—" before a start.
pub fn span(start: i64, end: i64, now: i64) -> String {
    if start <= 0 {
        return "—".into();
    }
    let end = if end > 0 { end } else { now };
    duration_ms(u64::try_from(end - start).unwrap_or(0))
}

/// How long ago `then` (unix ms) was: "just now", "5 m ago".
pub fn age(then: i64, now: i64) -> String {
    if then <= 0 {
        return "—".into();
    }
    let secs = (now - then).max(0) / 1000;
    match secs {
        0..10 => "just now".into(),
        10..60 => format!("{secs} s ago"),
        60..3600 => format!("{} m ago", secs / 60),
        3600..86_400 => format!("{} h ago", secs / 3600),
        _ => format!("{} d ago", secs / 86_400),
    }
}

pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_like_a_person_wrote_it() {
        assert_eq!(usd(1_500_000), "$1.50");
        assert_eq!(
            run_state(RunState::AwaitingBudget as i32),
            "awaiting budget"
        );
        assert_eq!(fork_status(ForkStatus::Succeeded as i32), "succeeded");
        assert_eq!(verify(VerifyStatus::Passed as i32), "passed");
        assert_eq!(verify(0), "—");
        assert_eq!(duration_ms(850), "850 ms");
        assert_eq!(duration_ms(12_340), "12.3 s");
        assert_eq!(duration_ms(245_000), "4 m 05 s");
        assert_eq!(duration_ms(7_380_000), "2 h 03 m");
        assert_eq!(age(1_000, 1_000 + 5 * 60_000), "5 m ago");
        assert_eq!(span(0, 0, 5), "—");
        assert_eq!(span(1_000, 0, 3_000), "2.0 s");
    }

    #[test]
    fn done_and_live() {
        assert!(fork_done(ForkStatus::Failed as i32));
        assert!(!fork_done(ForkStatus::Running as i32));
        assert!(run_live(RunState::Paused as i32));
        assert!(!run_live(RunState::Cancelled as i32));
    }
}
