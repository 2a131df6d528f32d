//! What the gateway answers by itself: errors in the provider's own shape, so the agent
//! CLI shows the message, each refusal counted.

use super::metrics;
use bytes::Bytes;
use http_body_util::{BodyExt, Full, combinators::BoxBody};
use hyper::{Response, StatusCode, header};
use serde_json::json;

pub(super) type Body = BoxBody<Bytes, std::io::Error>;

/// The API family a request speaks, which shapes the gateway's own answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Provider {
    Anthropic,
    OpenAi,
}

impl Provider {
    /// The provider's name in OpenTelemetry's GenAI conventions (`crate::genai`).
    pub(super) fn genai_name(self) -> &'static str {
        match self {
            Self::Anthropic => "anthropic",
            Self::OpenAi => "openai",
        }
    }
}

/// A request refused: the metric's reason, then the answer's status, error type and
/// message.
pub(super) type Refusal = (&'static str, StatusCode, &'static str, String);

/// An error in the provider's own shape, so the agent CLI shows the message.
pub(super) fn error(
    provider: Provider,
    status: StatusCode,
    kind: &str,
    message: &str,
) -> Response<Body> {
    let message = format!("forkyard llm gateway: {message}");
    let body = match provider {
        Provider::Anthropic => {
            json!({"type": "error", "error": {"type": kind, "message": message}})
        }
        Provider::OpenAi => json!({"error": {"message": message, "type": kind, "code": kind}}),
    };
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "application/json")
        .body(full(body.to_string()))
        .expect("valid response")
}

/// The answer to a refused request, counted under its reason.
pub(super) fn refuse(provider: Provider, refusal: Refusal) -> Response<Body> {
    let (reason, status, kind, message) = refusal;
    refused(reason);
    error(provider, status, kind, &message)
}

fn full(text: String) -> Body {
    Full::new(Bytes::from(text))
        .map_err(|never| match never {})
        .boxed()
}

pub(super) fn refused(reason: &str) {
    metrics::get().refused.with_label_values(&[reason]).inc();
}

pub(super) fn budget_spent(provider: Provider, why: &str) -> Refusal {
    let message = format!("the fork's budget is spent: {why}");
    match provider {
        // Neither is retried by the CLIs: the agent stops and shows the message.
        Provider::Anthropic => (
            "budget",
            StatusCode::PAYMENT_REQUIRED,
            "billing_error",
            message,
        ),
        Provider::OpenAi => (
            "budget",
            StatusCode::TOO_MANY_REQUESTS,
            "insufficient_quota",
            message,
        ),
    }
}
