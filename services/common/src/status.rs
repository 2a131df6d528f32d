//! gRPC errors as clients can act on them: the message as before, plus the standard
//! `google.rpc` details (through `tonic-types`): an `ErrorInfo` with a stable reason and
//! the service's domain on every error, a `BadRequest` naming the field of an
//! `INVALID_ARGUMENT`, and a `RetryInfo` on `UNAVAILABLE` and `RESOURCE_EXHAUSTED`
//! saying when trying again may help. grpcurl prints them; tonic clients read them with
//! `tonic_types::StatusExt`.

use std::time::Duration;
use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt as _};

/// How long a client should wait before trying a call again that failed for a reason
/// that passes (an outage, a limit).
pub const RETRY_AFTER: Duration = Duration::from_secs(1);

/// A status with its `ErrorInfo` (`reason` UPPER_SNAKE_CASE, stable; `domain` the
/// service, e.g. `gateway.forkyard`) and, where waiting helps, its `RetryInfo`.
pub fn with_reason(code: Code, message: impl Into<String>, domain: &str, reason: &str) -> Status {
    Status::with_error_details(code, message, details(code, domain, reason))
}

/// An `INVALID_ARGUMENT` naming `field` (the request field's path, e.g. `agent.driver`)
/// in a `BadRequest`, and in its `ErrorInfo`'s metadata.
pub fn invalid_field(
    field: &str,
    description: &str,
    message: impl Into<String>,
    domain: &str,
) -> Status {
    let mut d = ErrorDetails::with_bad_request_violation(field, description);
    d.set_error_info(
        "INVALID_ARGUMENT",
        domain,
        [("field".to_owned(), field.to_owned())],
    );
    Status::with_error_details(Code::InvalidArgument, message, d)
}

/// An `INVALID_ARGUMENT` whose message starts with the field's name (`forks: must be
/// 1..1000`), the convention of the services' bad-input messages: the field becomes the
/// `BadRequest`'s; a message without that shape gets the `ErrorInfo` alone.
pub fn invalid_message(message: impl Into<String>, domain: &str) -> Status {
    let message = message.into();
    match field_of(&message) {
        Some((field, description)) => {
            let (field, description) = (field.to_owned(), description.to_owned());
            invalid_field(&field, &description, message, domain)
        }
        None => with_reason(Code::InvalidArgument, message, domain, "INVALID_ARGUMENT"),
    }
}

/// `field: description`, where the field is a request path (`a-z`, digits, `_`, `.`,
/// `[]`).
fn field_of(message: &str) -> Option<(&str, &str)> {
    let (field, rest) = message.split_once(": ")?;
    let path = !field.is_empty()
        && field.bytes().all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'_' | b'.' | b'[' | b']')
        });
    path.then_some((field, rest))
}

/// The `ErrorInfo` a status carries: its domain (the service that said it) and reason;
/// `None` for a status without one (a transport failure, another server's).
pub fn reason_of(status: &Status) -> Option<(String, String)> {
    status
        .get_details_error_info()
        .map(|info| (info.domain, info.reason))
}

fn details(code: Code, domain: &str, reason: &str) -> ErrorDetails {
    let mut d = ErrorDetails::with_error_info(reason, domain, std::collections::HashMap::new());
    if matches!(code, Code::Unavailable | Code::ResourceExhausted) {
        d.set_retry_info(Some(RETRY_AFTER));
    }
    d
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_input_names_its_field_and_keeps_its_message() {
        let s = invalid_message("agent.driver: unknown driver \"x\"", "gateway.forkyard");
        assert_eq!(s.code(), Code::InvalidArgument);
        assert_eq!(s.message(), "agent.driver: unknown driver \"x\"");
        let bad = s.get_details_bad_request().expect("BadRequest");
        assert_eq!(bad.field_violations[0].field, "agent.driver");
        assert_eq!(bad.field_violations[0].description, "unknown driver \"x\"");
        let info = s.get_details_error_info().expect("ErrorInfo");
        assert_eq!(info.reason, "INVALID_ARGUMENT");
        assert_eq!(info.domain, "gateway.forkyard");
        assert_eq!(info.metadata["field"], "agent.driver");
        // Not a field's message: the reason alone.
        let s = invalid_message("Repository Not Found: x", "gateway.forkyard");
        assert!(s.get_details_bad_request().is_none());
        assert!(s.get_details_error_info().is_some());
    }

    #[test]
    fn outages_and_limits_say_when_to_retry_others_do_not() {
        for code in [Code::Unavailable, Code::ResourceExhausted] {
            let s = with_reason(code, "m", "ledger.forkyard", "R");
            let retry = s.get_details_retry_info().expect("RetryInfo");
            assert_eq!(retry.retry_delay, Some(RETRY_AFTER));
        }
        let s = with_reason(Code::NotFound, "m", "ledger.forkyard", "RUN_NOT_FOUND");
        assert!(s.get_details_retry_info().is_none());
        assert_eq!(s.get_details_error_info().unwrap().reason, "RUN_NOT_FOUND");
    }
}
