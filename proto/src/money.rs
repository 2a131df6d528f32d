//! Money: integer micro-USD everywhere an amount is held, sent or summed (the contracts'
//! `*_micros` fields), parsed from and printed as decimal dollars here and nowhere else.
//! An amount never touches a float; a price may (a fraction of a micro-dollar per
//! token or per CPU-second), and what a price makes is rounded up to whole micro-dollars
//! here ([`Usd::charged`]). It lives in the contracts' crate because every crate reads
//! it, the CLI included, which depends on nothing heavier.

use std::fmt;

/// Micro-USD in one US dollar.
pub const MICROS_PER_USD: i64 = 1_000_000;

/// Most dollars an amount a person types may hold (a budget, a raise).
const MAX_TYPED_USD: i64 = 1_000_000_000;

/// An amount of US dollars, held as integer micro-USD.
///
/// Prints as `$1.50` (cents when exact, else all six decimals: `$1.234567`); `{:#}`
/// always prints six (`$1.500000`), for columns that line up.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Usd(i64);

impl Usd {
    pub const ZERO: Self = Self(0);

    pub const fn from_micros(micros: i64) -> Self {
        Self(micros)
    }

    pub const fn micros(self) -> i64 {
        self.0
    }

    /// An amount a person typed: `"10"`, `"2.5"`, `"0.000001"`. At most six decimals, no
    /// sign, no exponent, at most 1,000,000,000 dollars; the error says why not.
    pub fn parse(s: &str) -> Result<Self, String> {
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
        if whole > MAX_TYPED_USD {
            return Err(format!("{s:?} is above the limit of {MAX_TYPED_USD} USD"));
        }
        let frac_micros: i64 = if frac.is_empty() {
            0
        } else {
            format!("{frac:0<6}").parse().unwrap_or(0)
        };
        Ok(Self(whole * MICROS_PER_USD + frac_micros))
    }

    /// An amount a program reported as a JSON number's text (`"0.1"`, `"1e-6"`), exactly:
    /// rounded half up past six decimals, an exponent applied to the digits, never through
    /// a float (so `0.1` is 100,000, not 99,999). `None` for a negative amount, what is not
    /// a number, or one too large to hold.
    pub fn parse_reported(text: &str) -> Option<Self> {
        let t = text.trim();
        if t.starts_with('-') {
            return None;
        }
        let (mantissa, exp) = match t.split_once(['e', 'E']) {
            Some((m, e)) => (m, e.strip_prefix('+').unwrap_or(e).parse::<i32>().ok()?),
            None => (t, 0),
        };
        let (whole, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
        if whole.is_empty()
            || !whole.bytes().all(|b| b.is_ascii_digit())
            || !frac.bytes().all(|b| b.is_ascii_digit())
        {
            return None;
        }
        let digits: Vec<u8> = whole
            .bytes()
            .chain(frac.bytes())
            .map(|b| b - b'0')
            .collect();
        let point = i64::try_from(whole.len()).ok()? + i64::from(exp);
        Self::from_digits(digits, point)
    }

    /// The amount whose decimal digits are `digits` with the point after the `point`th
    /// (bounded: past 1e40 it cannot be held, under 1e-30 it rounds to nothing).
    fn from_digits(mut digits: Vec<u8>, point: i64) -> Option<Self> {
        if point > 40 {
            return None;
        }
        if point < -30 {
            return Some(Self::ZERO);
        }
        let point = if point < 0 {
            let pad = usize::try_from(-point).ok()?;
            digits.splice(0..0, std::iter::repeat_n(0, pad));
            0
        } else {
            usize::try_from(point).ok()?
        };
        if digits.len() < point {
            digits.resize(point, 0);
        }
        let whole = digits[..point].iter().try_fold(0i64, |acc, d| {
            acc.checked_mul(10)?.checked_add(i64::from(*d))
        })?;
        let mut frac = digits[point..].to_vec();
        let round_up = frac.get(6).is_some_and(|d| *d >= 5);
        frac.truncate(6);
        frac.resize(6, 0);
        let micros = frac.iter().fold(0i64, |acc, d| acc * 10 + i64::from(*d));
        let micros = whole.checked_mul(MICROS_PER_USD)?.checked_add(micros)?;
        Some(Self(micros.checked_add(i64::from(round_up))?))
    }

    /// What a price made (micro-USD as a price times a quantity gives it), rounded up to
    /// whole micro-dollars: a fraction of one is still spend, but float noise
    /// (45.000000001) is not another micro-dollar. Negative and non-finite: nothing.
    pub fn charged(micros: f64) -> Self {
        if !micros.is_finite() {
            return Self::ZERO;
        }
        // Saturating: an amount past i64 is no amount anyone is charged.
        Self((micros - 1e-6).ceil().max(0.0) as i64)
    }

    /// In dollars, for a metric's value or a chart; never for arithmetic.
    pub fn dollars_f64(self) -> f64 {
        self.0 as f64 / MICROS_PER_USD as f64
    }
}

impl fmt::Display for Usd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sign = if self.0 < 0 { "-" } else { "" };
        let m = self.0.unsigned_abs();
        let (whole, frac) = (m / 1_000_000, m % 1_000_000);
        if !f.alternate() && frac % 10_000 == 0 {
            write!(f, "{sign}${whole}.{:02}", frac / 10_000)
        } else {
            write!(f, "{sign}${whole}.{frac:06}")
        }
    }
}

impl std::str::FromStr for Usd {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        Self::parse(s)
    }
}

#[cfg(test)]
#[path = "money_tests.rs"]
mod tests;
