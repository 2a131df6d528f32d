//! Times as people read them: an ISO 8601 UTC timestamp and an age ("3m ago"), never
//! raw unix milliseconds.

use std::time::{SystemTime, UNIX_EPOCH};

/// `2026-11-24T21:37:14Z (3m ago)`; `-` for an unset time (0).
pub fn at(unix_ms: i64) -> String {
    if unix_ms <= 0 {
        return "-".into();
    }
    format!("{} ({})", iso(unix_ms), age(now_ms() - unix_ms))
}

/// The UTC timestamp to the second.
pub fn iso(unix_ms: i64) -> String {
    let secs = unix_ms.div_euclid(1000);
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// How long ago, in the largest whole unit: `12s ago`, `3m ago`, `5h ago`, `2d ago`.
pub fn age(elapsed_ms: i64) -> String {
    let s = elapsed_ms.max(0) / 1000;
    match s {
        0..=59 => format!("{s}s ago"),
        60..=3_599 => format!("{}m ago", s / 60),
        3_600..=86_399 => format!("{}h ago", s / 3600),
        _ => format!("{}d ago", s / 86_400),
    }
}

pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// (year, month, day) of a day count since 1970-01-01 (Howard Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

#[cfg(test)]
mod tests {
    use super::{age, at, iso};

    #[test]
    fn timestamps_are_iso_utc() {
        assert_eq!(iso(0), "1970-01-01T00:00:00Z");
        assert_eq!(iso(1_704_067_200_500), "2024-01-01T00:00:00Z");
        assert_eq!(iso(951_782_400_000), "2000-02-29T00:00:00Z");
        assert_eq!(iso(1_795_555_034_000), "2026-11-24T21:17:14Z");
    }

    #[test]
    fn ages_use_the_largest_whole_unit() {
        assert_eq!(age(12_400), "12s ago");
        assert_eq!(age(185_000), "3m ago");
        assert_eq!(age(5 * 3_600_000 + 1), "5h ago");
        assert_eq!(age(49 * 3_600_000), "2d ago");
        assert_eq!(age(-5), "0s ago");
        assert_eq!(at(0), "-");
    }
}
