//! Wall-clock times as the contracts carry them: milliseconds since the Unix epoch.

use std::time::{SystemTime, UNIX_EPOCH};

/// `t` in milliseconds since the Unix epoch; 0 for none or a time before it.
pub fn unix_ms(t: Option<SystemTime>) -> i64 {
    t.and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// Now, in milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    unix_ms(Some(SystemTime::now()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn times_before_the_epoch_or_missing_are_zero() {
        assert_eq!(unix_ms(None), 0);
        assert_eq!(unix_ms(Some(UNIX_EPOCH - Duration::from_secs(1))), 0);
        assert_eq!(
            unix_ms(Some(UNIX_EPOCH + Duration::from_millis(1234))),
            1234
        );
        assert!(now_ms() > 1_700_000_000_000);
    }
}
