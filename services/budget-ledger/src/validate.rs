//! Request checks; each error names the offending field.

use crate::error::LedgerError;

pub(crate) fn non_empty(field: &'static str, value: &str) -> Result<(), LedgerError> {
    if value.trim().is_empty() {
        return Err(LedgerError::invalid(field, "must not be empty"));
    }
    Ok(())
}

pub(crate) fn non_negative(field: &'static str, value: i64) -> Result<(), LedgerError> {
    if value < 0 {
        return Err(LedgerError::invalid(
            field,
            format!("must not be negative, got {value}"),
        ));
    }
    Ok(())
}

pub(crate) fn positive(field: &'static str, value: i64) -> Result<(), LedgerError> {
    if value <= 0 {
        return Err(LedgerError::invalid(
            field,
            format!("must be greater than zero, got {value}"),
        ));
    }
    Ok(())
}

/// A money amount: not negative (or > 0 when `positive`), at most
/// [`crate::model::MAX_AMOUNT_MICROS`].
pub(crate) fn amount(field: &'static str, value: i64, positive: bool) -> Result<(), LedgerError> {
    if positive {
        self::positive(field, value)?;
    } else {
        non_negative(field, value)?;
    }
    if value > crate::model::MAX_AMOUNT_MICROS {
        return Err(LedgerError::invalid(
            field,
            format!(
                "{value} micro-USD is more than the largest amount, {}",
                crate::model::MAX_AMOUNT_MICROS
            ),
        ));
    }
    Ok(())
}
