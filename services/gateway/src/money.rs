//! Exact decimal dollars ↔ integer micro-USD. Money never touches a float.

use forkyard_proto::MICROS_PER_USD;

/// Parse "10", "2.5", "0.000001" into micro-USD. At most 6 decimals, no sign, no
/// exponent, at most 1,000,000,000 USD.
pub fn parse_usd(s: &str) -> Result<i64, String> {
    let s = s.trim();
    if s.is_empty() {
        return Err("is empty; give an amount in US dollars such as \"10\" or \"2.50\"".into());
    }
    if s.starts_with('-') {
        return Err(format!("{s:?} is negative"));
    }
    let (whole, frac) = s.split_once('.').unwrap_or((s, ""));
    let digits = |p: &str| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit());
    if !digits(whole) || (s.contains('.') && !digits(frac)) {
        return Err(format!("{s:?} is not a decimal amount of US dollars"));
    }
    if frac.len() > 6 {
        return Err(format!(
            "{s:?} has more than 6 decimal places (the unit is 1 micro-USD)"
        ));
    }
    let whole: i64 = whole.parse().map_err(|_| format!("{s:?} is too large"))?;
    if whole > 1_000_000_000 {
        return Err(format!("{s:?} is above the limit of 1000000000 USD"));
    }
    let frac_micros: i64 = if frac.is_empty() {
        0
    } else {
        format!("{frac:0<6}").parse().unwrap_or(0)
    };
    Ok(whole * MICROS_PER_USD + frac_micros)
}

/// "$1.234500" style, trimmed to cents when exact.
pub fn format_usd(micros: i64) -> String {
    let sign = if micros < 0 { "-" } else { "" };
    let m = micros.unsigned_abs();
    let (whole, frac) = (m / 1_000_000, m % 1_000_000);
    if frac % 10_000 == 0 {
        format!("{sign}${whole}.{:02}", frac / 10_000)
    } else {
        format!("{sign}${whole}.{frac:06}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_exact_decimals() {
        assert_eq!(parse_usd("10"), Ok(10_000_000));
        assert_eq!(parse_usd("2.5"), Ok(2_500_000));
        assert_eq!(parse_usd("0.000001"), Ok(1));
        assert_eq!(parse_usd(" 3.10 "), Ok(3_100_000));
    }

    #[test]
    fn refuses_what_is_not_money() {
        for bad in [
            "",
            "-1",
            "1e3",
            "abc",
            "1.",
            ".5",
            "1.0000001",
            "NaN",
            "inf",
            "99999999999999999999",
            "1000000001",
        ] {
            assert!(parse_usd(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn formats() {
        assert_eq!(format_usd(10_000_000), "$10.00");
        assert_eq!(format_usd(1_234_567), "$1.234567");
        assert_eq!(format_usd(0), "$0.00");
    }
}
