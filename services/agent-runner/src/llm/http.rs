//! One JSON POST with the retry rules both APIs share: 429, 529 (Anthropic's
//! "overloaded"), 5xx and network errors are retried with exponential backoff (honouring
//! `retry-after`); 4xx otherwise are final.
//!
//! The backoff is jittered (each wait between one and two times the doubling delay, at
//! most `max_delay`):
//! the forks of a run hit a model API's rate limit together, and without jitter they
//! would all come back at the same instant and be refused together again.

use super::{LlmError, Secret};
use backon::{BackoffBuilder, ExponentialBuilder};
use forkyard_proto::common::v1::Usage;
use reqwest::{StatusCode, header::HeaderMap};
use serde_json::Value;
use std::time::Duration;
use tracing::Instrument as _;

#[derive(Debug, Clone, Copy)]
pub struct RetryPolicy {
    /// Tries in all, including the first.
    pub attempts: u32,
    pub initial: Duration,
    pub max_delay: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            attempts: 6,
            initial: Duration::from_secs(1),
            max_delay: Duration::from_secs(30),
        }
    }
}

fn retryable(status: StatusCode) -> bool {
    status == StatusCode::TOO_MANY_REQUESTS || status.as_u16() == 529 || status.is_server_error()
}

fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let v = headers.get("retry-after")?.to_str().ok()?;
    v.trim()
        .parse::<f64>()
        .ok()
        .filter(|s| s.is_finite() && *s >= 0.0)
        .map(Duration::from_secs_f64)
}

/// The error message inside an API error body (`{"error":{"message":…}}` in both
/// protocols), else the body's start.
fn error_message(body: &str, key: Option<&Secret>) -> String {
    let parsed: Option<Value> = serde_json::from_str(body).ok();
    let msg = parsed
        .as_ref()
        .and_then(|v| v.pointer("/error/message"))
        .and_then(Value::as_str)
        .map_or_else(|| body.chars().take(300).collect(), str::to_owned);
    match key {
        Some(k) => k.scrub(&msg),
        None => msg,
    }
}

/// The waits between tries: doubling from `initial`, each jittered up to twice itself,
/// never over `max_delay`.
fn backoff(policy: RetryPolicy) -> impl Iterator<Item = Duration> {
    ExponentialBuilder::default()
        .with_min_delay(policy.initial)
        // Jitter adds up to the delay again: at the cap the waits still spread, over
        // [max / 2, max).
        .with_max_delay(policy.max_delay / 2)
        .with_factor(2.0)
        .with_max_times(policy.attempts.max(1) as usize)
        .with_jitter()
        .build()
}

fn server_of(url: &str) -> String {
    reqwest::Url::parse(url)
        .ok()
        .and_then(|u| u.host_str().map(str::to_owned))
        .unwrap_or_default()
}

fn path_of(url: &str) -> String {
    reqwest::Url::parse(url)
        .map(|u| u.path().to_owned())
        .unwrap_or_default()
}

/// The model call a request is, for its span (`crate::genai`): the provider's name in
/// the conventions, the model asked for, and how the response states its usage.
#[derive(Clone, Copy)]
pub struct Chat<'a> {
    pub provider: &'static str,
    pub model: &'a str,
    pub usage: fn(&Value) -> Usage,
}

/// POST `body` to `url` with `headers`, retrying per `policy`. `key` only scrubs texts.
/// Traced as one `chat {model}` span over every attempt (`crate::genai`): the server and
/// path (never the query, headers or body), the attempts made, the last status and the
/// tokens used.
pub async fn post_json(
    client: &reqwest::Client,
    url: &str,
    headers: HeaderMap,
    body: &Value,
    policy: RetryPolicy,
    key: Option<&Secret>,
    chat: Chat<'_>,
) -> Result<Value, LlmError> {
    let span = crate::chat_span!(
        server.address = %server_of(url),
        url.path = %path_of(url),
        attempts = tracing::field::Empty,
        http.response.status_code = tracing::field::Empty,
    );
    crate::genai::record_request(&span, chat.provider, chat.model);
    let resp = attempts(client, url, headers, body, policy, key)
        .instrument(span.clone())
        .await?;
    let model = resp.get("model").and_then(Value::as_str);
    crate::genai::record_usage(&span, model, &(chat.usage)(&resp));
    Ok(resp)
}

/// [`post_json`]'s tries, inside its span.
async fn attempts(
    client: &reqwest::Client,
    url: &str,
    headers: HeaderMap,
    body: &Value,
    policy: RetryPolicy,
    key: Option<&Secret>,
) -> Result<Value, LlmError> {
    let attempts = policy.attempts.max(1);
    let mut delays = backoff(policy);
    for attempt in 1..=attempts {
        let last = attempt == attempts;
        tracing::Span::current().record("attempts", attempt);
        let sent = client
            .post(url)
            .headers(headers.clone())
            .json(body)
            .send()
            .await;
        let (status, wait, message) = match sent {
            Err(e) => {
                // reqwest errors carry the URL, never headers; scrub anyway.
                let m = e.without_url().to_string();
                (0, None, key.map_or(m.clone(), |k| k.scrub(&m)))
            }
            Ok(resp) => {
                let status = resp.status();
                tracing::Span::current().record("http.response.status_code", status.as_u16());
                let wait = retry_after(resp.headers());
                let text = resp.text().await.unwrap_or_default();
                if status.is_success() {
                    return serde_json::from_str(&text)
                        .map_err(|e| LlmError::Protocol(format!("response is not JSON: {e}")));
                }
                let message = error_message(&text, key);
                if !retryable(status) {
                    return Err(LlmError::Rejected {
                        status: status.as_u16(),
                        message,
                    });
                }
                (status.as_u16(), wait, message)
            }
        };
        if last {
            return Err(LlmError::Unavailable {
                status,
                attempts,
                message,
            });
        }
        let delay = delays.next().unwrap_or(policy.max_delay);
        // What the server asked for, when it said; the jittered backoff otherwise.
        let pause = wait.unwrap_or(delay).min(policy.max_delay);
        tracing::warn!(status, attempt, delay_ms = pause.as_millis() as u64, error = %message, "model API call failed, retrying");
        tokio::time::sleep(pause).await;
    }
    unreachable!("the last attempt returns")
}

#[cfg(test)]
mod tests {
    use super::{RetryPolicy, backoff};
    use std::time::Duration;

    #[test]
    fn waits_double_spread_and_stay_under_the_cap() {
        let policy = RetryPolicy {
            attempts: 8,
            initial: Duration::from_secs(1),
            max_delay: Duration::from_secs(30),
        };
        let runs: Vec<Vec<Duration>> = (0..20).map(|_| backoff(policy).collect()).collect();
        for waits in &runs {
            assert_eq!(waits.len(), 8);
            // 1, 2, 4, 8, then 15 (half the cap), each times [1, 2).
            let base = [1, 2, 4, 8, 15, 15, 15, 15].map(Duration::from_secs);
            for (w, b) in waits.iter().zip(base) {
                assert!(*w >= b && *w < b * 2, "{w:?} not in [{b:?}, {:?})", b * 2);
                assert!(*w <= policy.max_delay, "{w:?}");
            }
        }
        // Forks that failed together do not come back together.
        let firsts: std::collections::HashSet<Duration> = runs.iter().map(|w| w[0]).collect();
        assert!(firsts.len() > 10, "{firsts:?}");
    }
}
