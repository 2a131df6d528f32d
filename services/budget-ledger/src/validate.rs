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
