//! What a request must pass before it goes upstream: a route the gateway serves, a live
//! token presented from its own sandbox, a fork not stopped, and a model its run allows.

use super::{
    gateway::LlmGateway,
    grants::{Grant, Stop},
    meter::Api,
    reply::{Provider, Refusal, budget_spent},
};
use bytes::Bytes;
use hyper::{
    Method, StatusCode,
    header::{self, HeaderMap},
};
use serde_json::Value;
use std::{sync::Arc, time::Duration};

pub(super) fn route(
    method: &Method,
    path: &str,
    headers: &HeaderMap,
) -> Option<(Provider, Option<Api>)> {
    use Provider::{Anthropic, OpenAi};
    match (method, path.trim_end_matches('/')) {
        (&Method::POST, "/v1/messages") => Some((Anthropic, Some(Api::Messages))),
        (&Method::POST, "/v1/messages/count_tokens") => Some((Anthropic, None)),
        (&Method::POST, "/v1/chat/completions") => Some((OpenAi, Some(Api::ChatCompletions))),
        (&Method::POST, "/v1/responses") => Some((OpenAi, Some(Api::Responses))),
        (&Method::GET, p) if p == "/v1/models" || p.starts_with("/v1/models/") => Some((
            if headers.contains_key("anthropic-version") {
                Anthropic
            } else {
                OpenAi
            },
            None,
        )),
        _ => None,
    }
}

/// The token an agent presents: Anthropic clients send `x-api-key`, OpenAI clients
/// `Authorization: Bearer`.
fn token_of(headers: &HeaderMap) -> Option<&str> {
    if let Some(v) = headers.get("x-api-key").and_then(|v| v.to_str().ok()) {
        return Some(v.trim());
    }
    let auth = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    auth.strip_prefix("Bearer ").map(str::trim)
}

/// The grant whose token the request presents (`headers`), if it is live, comes from
/// `sandbox` (the relay's header; `None` on the public listener, which takes only the
/// tokens of remote sandboxes), and its fork is neither out of budget nor unable to
/// record spend.
pub(super) async fn checked_grant(
    gw: &LlmGateway,
    sandbox: Option<&str>,
    headers: &HeaderMap,
    provider: Provider,
) -> Result<Arc<Grant>, Refusal> {
    let Some(grant) = token_of(headers).and_then(|t| gw.grants.get(t)) else {
        return Err((
            "unknown_token",
            StatusCode::UNAUTHORIZED,
            "authentication_error",
            "the token is not valid (its fork's agent has ended, or it was never issued)".into(),
        ));
    };
    let Some(sandbox) = sandbox else {
        if grant.remote {
            return checked_spend(grant, provider).await;
        }
        tracing::warn!(run_id = %grant.run_id, fork = grant.fork, token_sandbox_id = %grant.sandbox_id, "a local sandbox's llm token was presented on the public listener");
        return Err((
            "not_remote",
            StatusCode::FORBIDDEN,
            "permission_error",
            "this token is not for the public endpoint".into(),
        ));
    };
    if grant.sandbox_id != sandbox {
        tracing::warn!(run_id = %grant.run_id, fork = grant.fork, sandbox_id = %sandbox, token_sandbox_id = %grant.sandbox_id, "a sandbox presented another fork's llm token");
        return Err((
            "wrong_sandbox",
            StatusCode::FORBIDDEN,
            "permission_error",
            "this token belongs to another sandbox".into(),
        ));
    }
    checked_spend(grant, provider).await
}

/// The grant, once its answered requests are charged, unless its fork may spend no more.
async fn checked_spend(grant: Arc<Grant>, provider: Provider) -> Result<Arc<Grant>, Refusal> {
    grant.charges_posted(Duration::from_secs(10)).await;
    match grant.stopped() {
        Some(Stop::Spent(why)) => Err(budget_spent(provider, &why)),
        Some(Stop::LedgerAway(why)) => Err((
            "ledger",
            StatusCode::SERVICE_UNAVAILABLE,
            "api_error",
            format!("spend cannot be recorded: {why}"),
        )),
        None => Ok(grant),
    }
}

/// The request's model, checked against the grant; the body to send (for a streamed
/// chat completion, asking for the usage chunk the meter needs).
pub(super) fn checked_body(
    gw: &LlmGateway,
    grant: &Grant,
    api: Api,
    body: &Bytes,
) -> Result<(String, Bytes), Refusal> {
    let bad = |m: String| {
        (
            "bad_request",
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            m,
        )
    };
    let mut v: Value =
        serde_json::from_slice(body).map_err(|e| bad(format!("the body is not JSON: {e}")))?;
    let asked = v
        .get("model")
        .and_then(Value::as_str)
        .filter(|m| !m.is_empty())
        .ok_or_else(|| bad("the request names no model".into()))?;
    let model = gw
        .models
        .aliases
        .get(asked)
        .cloned()
        .unwrap_or_else(|| asked.to_owned());
    if !grant.allowed.permits(&model) {
        return Err((
            "model",
            StatusCode::FORBIDDEN,
            "permission_error",
            format!(
                "model {asked:?} is not allowed for this run (allowed: {})",
                grant.allowed.describe()
            ),
        ));
    }
    if api == Api::ChatCompletions && v.get("stream").and_then(Value::as_bool) == Some(true) {
        v["stream_options"]["include_usage"] = Value::Bool(true);
        return Ok((model, Bytes::from(v.to_string())));
    }
    Ok((model, body.clone()))
}
