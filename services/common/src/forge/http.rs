//! One call to a forge's API: the shared client (timeouts, redirects, no proxy), the
//! answer read up to its cap, and its errors put in words without the token.

use super::{Forge, ForgeError};
use crate::secret::Secret;
use reqwest::{
    StatusCode,
    header::{HeaderName, HeaderValue},
};
use std::{sync::LazyLock, time::Duration};

pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
pub(crate) const TOTAL_TIMEOUT: Duration = Duration::from_secs(30);
/// The most of an answer read: a pull request's JSON is a few KiB, a list of them (one
/// branch's) not many more.
pub(crate) const MAX_BODY: usize = 1 << 20;
/// GitHub refuses requests without one.
pub(crate) const USER_AGENT: &str = concat!("forkyard/", env!("CARGO_PKG_VERSION"));
/// What an API message may add to an error: enough for GitHub's validation errors.
const MAX_MESSAGE: usize = 600;

/// One client for every call (its connections are reused). Redirects are followed only
/// on the API's own origin, since the token header (`PRIVATE-TOKEN` is not one reqwest
/// knows to drop) would go along. No proxy from the environment: the API is the
/// operator's, named in its own configuration.
static CLIENT: LazyLock<Result<reqwest::Client, String>> = LazyLock::new(|| {
    reqwest::Client::builder()
        .connect_timeout(CONNECT_TIMEOUT)
        .timeout(TOTAL_TIMEOUT)
        .user_agent(USER_AGENT)
        .no_proxy()
        .redirect(reqwest::redirect::Policy::custom(|attempt| {
            let same_origin = attempt
                .previous()
                .first()
                .is_some_and(|first| first.origin() == attempt.url().origin());
            if attempt.previous().len() > 5 || !same_origin {
                attempt.stop()
            } else {
                attempt.follow()
            }
        }))
        .build()
        .map_err(|e| format!("cannot set up an http client: {e}"))
});

/// An answer, read whole (up to [`MAX_BODY`]).
pub(crate) struct Answer {
    pub status: StatusCode,
    pub body: Vec<u8>,
}

/// One call's context: which forge, what it is for (in errors), and its token (to keep
/// out of them).
pub(crate) struct Call<'a> {
    pub forge: Forge,
    pub what: String,
    pub token: &'a Secret,
}

impl Call<'_> {
    pub fn client(&self) -> Result<&'static reqwest::Client, ForgeError> {
        CLIENT.as_ref().map_err(|e| ForgeError::Setup(e.clone()))
    }

    /// The auth header, marked sensitive (left out of reqwest's and hyper's Debug).
    pub fn auth_header(
        &self,
        name: HeaderName,
        prefix: &str,
    ) -> Result<(HeaderName, HeaderValue), ForgeError> {
        let mut value = HeaderValue::from_str(&format!("{prefix}{}", self.token.expose()))
            .map_err(|_| {
                ForgeError::Setup(format!(
                    "{} {}: the token is not a valid header value",
                    self.forge, self.what
                ))
            })?;
        value.set_sensitive(true);
        Ok((name, value))
    }

    /// Send, and read the answer up to its cap.
    pub async fn send(&self, request: reqwest::RequestBuilder) -> Result<Answer, ForgeError> {
        let mut response = request.send().await.map_err(|e| self.failed(&e))?;
        let status = response.status();
        let mut body = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(|e| self.failed(&e))? {
            if body.len() + chunk.len() > MAX_BODY {
                return Err(self.answer(format!("http {status}: over {MAX_BODY} bytes")));
            }
            body.extend_from_slice(&chunk);
        }
        Ok(Answer { status, body })
    }

    /// A successful answer's JSON.
    pub fn json<T: serde::de::DeserializeOwned>(&self, answer: &Answer) -> Result<T, ForgeError> {
        serde_json::from_slice(&answer.body)
            .map_err(|e| self.answer(format!("http {}: {e}", answer.status.as_u16())))
    }

    /// An error status, with the API's message.
    pub fn status_error(&self, answer: &Answer) -> ForgeError {
        let message = api_message(&answer.body).unwrap_or_else(|| {
            answer
                .status
                .canonical_reason()
                .unwrap_or("no message")
                .to_ascii_lowercase()
        });
        ForgeError::Status {
            forge: self.forge,
            what: self.what.clone(),
            status: answer.status.as_u16(),
            message: self.redact(&message),
        }
    }

    pub fn answer(&self, reason: String) -> ForgeError {
        ForgeError::Answer {
            forge: self.forge,
            what: self.what.clone(),
            reason: self.redact(&reason),
        }
    }

    fn failed(&self, e: &reqwest::Error) -> ForgeError {
        if e.is_timeout() {
            return ForgeError::Timeout {
                forge: self.forge,
                what: self.what.clone(),
            };
        }
        // reqwest's own line says only "error sending request"; the cause is below it.
        let mut reason = e.to_string();
        let mut source = std::error::Error::source(e);
        while let Some(s) = source {
            reason = format!("{reason}: {s}");
            source = s.source();
        }
        ForgeError::Unreachable {
            forge: self.forge,
            what: self.what.clone(),
            reason: self.redact(&reason),
        }
    }

    /// The text with the token taken out, should an API (or a proxy before it) echo it.
    fn redact(&self, text: &str) -> String {
        let token = self.token.expose();
        let text = if token.len() >= 4 {
            text.replace(token, "…")
        } else {
            text.to_owned()
        };
        match text.char_indices().nth(MAX_MESSAGE) {
            Some((at, _)) => format!("{}…", &text[..at]),
            None => text,
        }
    }
}

/// The API's own words: `message` (GitHub: a string; GitLab: a string, a list or an
/// object of fields' lists) and GitHub's `errors[].message` or `code`.
pub(crate) fn api_message(body: &[u8]) -> Option<String> {
    let json: serde_json::Value = serde_json::from_slice(body).ok()?;
    let mut parts = Vec::new();
    if let Some(m) = json.get("message") {
        flatten(m, &mut parts);
    }
    if let Some(m) = json.get("error_description").or_else(|| json.get("error")) {
        flatten(m, &mut parts);
    }
    for e in json
        .get("errors")
        .and_then(|e| e.as_array())
        .into_iter()
        .flatten()
    {
        match e.get("message").or_else(|| e.get("code")) {
            Some(m) => flatten(m, &mut parts),
            None => flatten(e, &mut parts),
        }
    }
    (!parts.is_empty()).then(|| parts.join("; "))
}

fn flatten(value: &serde_json::Value, parts: &mut Vec<String>) {
    match value {
        serde_json::Value::String(s) => parts.push(s.clone()),
        serde_json::Value::Array(items) => items.iter().for_each(|i| flatten(i, parts)),
        serde_json::Value::Object(fields) => {
            for (name, v) in fields {
                let mut inner = Vec::new();
                flatten(v, &mut inner);
                parts.push(format!("{name} {}", inner.join(", ")));
            }
        }
        other => parts.push(other.to_string()),
    }
}

/// `api` with `segments` appended, each percent-encoded as one segment (a GitLab
/// project's `group/name` becomes `group%2Fname`).
pub(crate) fn endpoint(
    call: &Call<'_>,
    api: &url::Url,
    segments: &[&str],
) -> Result<url::Url, ForgeError> {
    let mut url = api.clone();
    url.path_segments_mut()
        .map_err(|()| {
            ForgeError::Setup(format!(
                "{} {}: the api is not an http url",
                call.forge, call.what
            ))
        })?
        .pop_if_empty()
        .extend(segments);
    Ok(url)
}
