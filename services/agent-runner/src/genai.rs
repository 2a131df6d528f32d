//! Model requests as OpenTelemetry's GenAI semantic conventions name them, so a trace
//! backend's LLM views (token use per model, latency per operation) read Forkyard's spans
//! as they read any SDK's: the span `chat {model}`, a client span, with
//! `gen_ai.operation.name`, `gen_ai.provider.name`, `gen_ai.request.model`,
//! `gen_ai.response.model` and the `gen_ai.usage.*` token counts.
//!
//! One home for both places a model is called: the LLM gateway that the agent CLIs in
//! the sandboxes go through, and the built-in drivers' own requests.

use forkyard_proto::common::v1::Usage;

/// The operation every metered API here performs (Messages, Chat Completions, Responses).
pub const OPERATION: &str = "chat";

/// A model request's span, `llm.request` until [`record_request`] renames it, with the
/// GenAI fields declared (a `tracing` span records only fields declared up front) and
/// whatever else the caller adds.
#[macro_export]
macro_rules! chat_span {
    ($($field:tt)*) => {
        tracing::info_span!(
            "llm.request",
            otel.kind = "client",
            gen_ai.operation.name = tracing::field::Empty,
            gen_ai.provider.name = tracing::field::Empty,
            gen_ai.request.model = tracing::field::Empty,
            gen_ai.response.model = tracing::field::Empty,
            gen_ai.usage.input_tokens = tracing::field::Empty,
            gen_ai.usage.output_tokens = tracing::field::Empty,
            gen_ai.usage.cache_read.input_tokens = tracing::field::Empty,
            gen_ai.usage.cache_creation.input_tokens = tracing::field::Empty,
            $($field)*
        )
    };
}

/// What is asked: the span becomes `chat {model}`. `provider` is the convention's name
/// (`anthropic`, `openai`).
pub fn record_request(span: &tracing::Span, provider: &str, model: &str) {
    forkyard_common::telemetry::rename(span, format!("{OPERATION} {model}"));
    span.record("gen_ai.operation.name", OPERATION);
    span.record("gen_ai.provider.name", provider);
    span.record("gen_ai.request.model", model);
}

/// What was used. The convention's input tokens are the whole prompt, cached parts
/// included (Forkyard's `Usage` keeps them apart for pricing); the cached parts are also
/// given on their own.
pub fn record_usage(span: &tracing::Span, response_model: Option<&str>, usage: &Usage) {
    if let Some(model) = response_model.filter(|m| !m.is_empty()) {
        span.record("gen_ai.response.model", model);
    }
    let prompt = usage.input_tokens + usage.cache_read_tokens + usage.cache_write_tokens;
    span.record("gen_ai.usage.input_tokens", prompt);
    span.record("gen_ai.usage.output_tokens", usage.output_tokens);
    span.record(
        "gen_ai.usage.cache_read.input_tokens",
        usage.cache_read_tokens,
    );
    span.record(
        "gen_ai.usage.cache_creation.input_tokens",
        usage.cache_write_tokens,
    );
}
