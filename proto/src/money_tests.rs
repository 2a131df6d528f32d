//! Money parsed as people type it and as programs report it, printed, and charged.

use super::*;

#[test]
fn typed_amounts_parse_exactly() {
    assert_eq!(Usd::parse("10"), Ok(Usd::from_micros(10_000_000)));
    assert_eq!(Usd::parse("2.5"), Ok(Usd::from_micros(2_500_000)));
    assert_eq!(Usd::parse("0.000001"), Ok(Usd::from_micros(1)));
    assert_eq!(Usd::parse(" 3.10 "), Ok(Usd::from_micros(3_100_000)));
    assert_eq!("1".parse::<Usd>(), Ok(Usd::from_micros(MICROS_PER_USD)));
}

#[test]
fn what_is_not_a_typed_amount_is_refused_saying_why() {
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
        assert!(Usd::parse(bad).is_err(), "{bad:?} accepted");
    }
    assert!(
        Usd::parse("1.0000001")
            .unwrap_err()
            .contains("6 decimal places")
    );
}

#[test]
fn prints_cents_when_exact_and_six_decimals_otherwise_or_when_asked() {
    assert_eq!(Usd::from_micros(10_000_000).to_string(), "$10.00");
    assert_eq!(Usd::from_micros(1_234_567).to_string(), "$1.234567");
    assert_eq!(Usd::ZERO.to_string(), "$0.00");
    assert_eq!(Usd::from_micros(-1_500_000).to_string(), "-$1.50");
    assert_eq!(format!("{:#}", Usd::from_micros(1_500_000)), "$1.500000");
    for m in [0, 1, 999_999, 1_000_000, 123_450_000] {
        let u = Usd::from_micros(m);
        assert_eq!(Usd::parse(&u.to_string()[1..]), Ok(u), "{u}");
    }
}

#[test]
fn reported_amounts_round_past_micro_precision_and_take_exponents() {
    let r = |t: &str| Usd::parse_reported(t).map(Usd::micros);
    assert_eq!(r("0.1"), Some(100_000));
    assert_eq!(r("0.0000015"), Some(2));
    assert_eq!(r("0.0000014"), Some(1));
    assert_eq!(r("12"), Some(12_000_000));
    assert_eq!(r("-1"), None);
    assert_eq!(r("1e3"), Some(1_000_000_000));
    assert_eq!(r("1e-6"), Some(1));
    assert_eq!(r("2.5E-6"), Some(3));
    assert_eq!(r("1.5e+2"), Some(150_000_000));
    assert_eq!(r("1e-40"), Some(0));
    assert_eq!(r("1e99"), None);
    assert_eq!(r("1e"), None);
    assert_eq!(r("9223372036854.7758075"), None, "overflow by the rounding");
    // Agent output is untrusted: nothing it prints may panic.
    for bad in [
        "0. 5",
        "0.-5",
        "",
        ".",
        "abc",
        "1.2.3",
        "99999999999999999999",
        "0.12345678901234567890",
        "1e2147483647",
        "1e-2147483648",
        "9e18",
        "e5",
    ] {
        let _ = Usd::parse_reported(bad);
    }
}

#[test]
fn a_price_charges_whole_micro_dollars_rounded_up_without_float_noise() {
    assert_eq!(Usd::charged(45.000_000_001).micros(), 45);
    assert_eq!(Usd::charged(45.1).micros(), 46);
    assert_eq!(Usd::charged(0.2).micros(), 1);
    assert_eq!(Usd::charged(0.0).micros(), 0);
    assert_eq!(Usd::charged(-3.0).micros(), 0);
    assert_eq!(Usd::charged(f64::NAN).micros(), 0);
    assert_eq!(Usd::from_micros(2_500_000).dollars_f64(), 2.5);
}
