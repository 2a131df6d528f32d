//! E2B's control plane: its REST API (create, get, list, kill, timeout, pause, resume;
//! header `X-API-KEY`), its errors as the provisioner's, and its sandboxes as ours.

use super::{
    ApiKey, BACKEND, BRANCH_KEY, E2bBackend, EXPIRES_KEY, ID_PREFIX, IMAGE_KEY, KEY_KEY, MANAGED,
};
use crate::{
    error::{ProvisionerError, Result},
    limits::{STATE_SELECTOR, wanted_states},
};
use forkyard_proto::sandbox::v1::{Sandbox, SandboxState};
use reqwest::{Method, StatusCode};
use serde::Deserialize;
use serde_json::Value;
use std::collections::HashMap;

/// An E2B sandbox as the REST API describes it (create, get and list share fields).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct ApiSandbox {
    #[serde(rename = "sandboxID")]
    pub(super) sandbox_id: String,
    #[serde(default)]
    pub(super) metadata: Option<HashMap<String, String>>,
    #[serde(default)]
    pub(super) started_at: Option<String>,
    #[serde(default)]
    pub(super) end_at: Option<String>,
    #[serde(default)]
    pub(super) state: Option<String>,
    #[serde(default)]
    pub(super) envd_access_token: Option<String>,
    #[serde(default)]
    pub(super) domain: Option<String>,
}

impl E2bBackend {
    pub(super) fn key(&self) -> Result<&ApiKey> {
        self.config.api_key.as_ref().ok_or_else(|| {
            ProvisionerError::FailedPrecondition(
                "the e2b backend is disabled: set E2B_API_KEY to enable it".into(),
            )
        })
    }

    /// Strip the key (and anything after 512 bytes) from text that came from a server.
    pub(super) fn scrub(&self, text: &str) -> String {
        let mut s: String = text.chars().take(512).collect();
        if let Some(k) = &self.config.api_key
            && !k.expose().is_empty()
        {
            s = s.replace(k.expose(), "***");
        }
        s
    }

    pub(super) fn e2b_id(id: &str) -> Result<&str> {
        id.strip_prefix(ID_PREFIX)
            .filter(|s| !s.is_empty())
            .ok_or_else(|| ProvisionerError::NotFound(id.to_owned()))
    }

    /// A failed HTTP exchange: 401/403 are auth failures (final), 404 not found, 429
    /// and 5xx and transport errors retryable, other 4xx final.
    pub(super) fn status_error(
        &self,
        what: &str,
        id: &str,
        status: StatusCode,
        body: &str,
    ) -> ProvisionerError {
        let body = self.scrub(body);
        match status.as_u16() {
            401 | 403 => ProvisionerError::Auth(format!(
                "E2B rejected the API key (E2B_API_KEY) on {what}: {status}"
            )),
            404 => ProvisionerError::NotFound(if id.is_empty() {
                what.into()
            } else {
                id.into()
            }),
            429 | 500..=599 => {
                ProvisionerError::Unavailable(format!("E2B {what}: {status}: {body}"))
            }
            _ => ProvisionerError::FailedPrecondition(format!("E2B {what}: {status}: {body}")),
        }
    }

    pub(super) fn transport_error(&self, what: &str, e: &reqwest::Error) -> ProvisionerError {
        let kind = if e.is_timeout() {
            "timed out"
        } else {
            "failed"
        };
        ProvisionerError::Unavailable(format!("E2B {what} {kind}: {}", self.scrub(&e.to_string())))
    }

    /// One control-plane call; `Ok(None)` for an empty body.
    pub(super) async fn api(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, String)],
        body: Option<Value>,
        what: &str,
        id: &str,
    ) -> Result<Option<Value>> {
        let key = self.key()?;
        let url = format!("{}{path}", self.config.api_url.trim_end_matches('/'));
        let mut rb = self
            .http
            .request(method, url)
            .query(query)
            .header("X-API-KEY", key.expose())
            .timeout(self.config.request_timeout);
        if let Some(b) = body {
            rb = rb.json(&b);
        }
        let resp = rb
            .send()
            .await
            .map_err(|e| self.transport_error(what, &e))?;
        let status = resp.status();
        let text = resp
            .text()
            .await
            .map_err(|e| self.transport_error(what, &e))?;
        if !status.is_success() {
            return Err(self.status_error(what, id, status, &text));
        }
        if text.trim().is_empty() {
            return Ok(None);
        }
        serde_json::from_str(&text)
            .map(Some)
            .map_err(|e| ProvisionerError::Unavailable(format!("E2B {what}: bad JSON: {e}")))
    }

    pub(super) fn to_proto(&self, s: &ApiSandbox) -> Sandbox {
        let mut labels = s.metadata.clone().unwrap_or_default();
        let branch = labels.remove(BRANCH_KEY).unwrap_or_default();
        labels.remove(MANAGED);
        labels.remove(KEY_KEY);
        let image = labels.remove(IMAGE_KEY).unwrap_or_default();
        // Ours when we set it (E2B's endAt of a paused sandbox says nothing about it).
        let expires = labels
            .remove(EXPIRES_KEY)
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| s.end_at.as_deref().map_or(0, rfc3339_ms));
        let state = match s.state.as_deref() {
            Some("paused") => SandboxState::Stopped,
            _ => SandboxState::Ready,
        };
        let created = s.started_at.as_deref().map_or(0, rfc3339_ms);
        Sandbox {
            id: format!("{ID_PREFIX}{}", s.sandbox_id),
            backend: BACKEND.into(),
            state: state.into(),
            labels,
            branch,
            base_commit: self
                .known(&s.sandbox_id)
                .map(|k| k.base_commit)
                .unwrap_or_default(),
            created_unix_ms: created,
            owner_endpoint: self.owner_endpoint.clone(),
            owner_task_queue: self.owner_task_queue.clone(),
            expires_unix_ms: expires,
            usage: Some(self.usage(created)),
            image,
            ..Default::default()
        }
    }

    /// What a sandbox created at `created_unix_ms` has cost so far: its wall time.
    pub(super) fn usage(&self, created_unix_ms: i64) -> forkyard_proto::sandbox::v1::SandboxUsage {
        let wall_ms = if created_unix_ms > 0 {
            u64::try_from(crate::limits::now_ms() - created_unix_ms).unwrap_or(0)
        } else {
            0
        };
        let prices = crate::usage::Prices {
            e2b_second_usd: self.config.second_usd,
            ..Default::default()
        };
        forkyard_proto::sandbox::v1::SandboxUsage {
            wall_ms,
            cost_micros: prices.e2b(wall_ms),
            ..Default::default()
        }
    }

    pub(super) async fn kill(&self, sid: &str) -> Result<bool> {
        match self
            .api(
                Method::DELETE,
                &format!("/sandboxes/{sid}"),
                &[],
                None,
                "kill sandbox",
                sid,
            )
            .await
        {
            Ok(_) => Ok(true),
            Err(ProvisionerError::NotFound(_)) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// E2B's list, narrowed to our sandboxes and `selector` (labels; `forkyard.state`).
    pub(super) async fn list_api(
        &self,
        selector: &HashMap<String, String>,
    ) -> Result<Vec<Sandbox>> {
        let query = [("metadata", format!("{MANAGED}=true"))];
        let v = self
            .api(
                Method::GET,
                "/sandboxes",
                &query,
                None,
                "list sandboxes",
                "",
            )
            .await?
            .unwrap_or(Value::Array(Vec::new()));
        let all: Vec<ApiSandbox> = serde_json::from_value(v)
            .map_err(|e| ProvisionerError::Unavailable(format!("E2B list: {e}")))?;
        let states = wanted_states(selector);
        let mut out: Vec<Sandbox> = all
            .iter()
            .filter(|a| {
                let md = a.metadata.clone().unwrap_or_default();
                md.get(MANAGED).is_some_and(|v| v == "true")
                    && selector
                        .iter()
                        .all(|(k, v)| k == STATE_SELECTOR || md.get(k) == Some(v))
            })
            .map(|a| self.to_proto(a))
            .filter(|s| {
                let name = if s.state == SandboxState::Stopped as i32 {
                    "stopped"
                } else {
                    "ready"
                };
                states.is_empty() || states.iter().any(|st| st == name)
            })
            .collect();
        out.sort_by(|a, b| (a.created_unix_ms, &a.id).cmp(&(b.created_unix_ms, &b.id)));
        Ok(out)
    }
}

/// Milliseconds since the epoch of an RFC 3339 UTC timestamp (0 if unparsable).
pub(super) fn rfc3339_ms(s: &str) -> i64 {
    fn num(s: &str) -> Option<i64> {
        s.parse().ok()
    }
    let parse = || -> Option<i64> {
        let (date, time) = s.split_once('T')?;
        let mut d = date.split('-');
        let (y, m, day) = (num(d.next()?)?, num(d.next()?)?, num(d.next()?)?);
        let t = time.trim_end_matches('Z');
        let t = t.split(['+']).next()?;
        let mut parts = t.split(':');
        let (hh, mm) = (num(parts.next()?)?, num(parts.next()?)?);
        let sec: f64 = parts.next()?.parse().ok()?;
        // days from civil (Howard Hinnant)
        let y = if m <= 2 { y - 1 } else { y };
        let era = y.div_euclid(400);
        let yoe = y - era * 400;
        let mp = (m + 9) % 12;
        let doy = (153 * mp + 2) / 5 + day - 1;
        let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
        let days = era * 146_097 + doe - 719_468;
        #[allow(clippy::cast_possible_truncation)]
        let ms = (sec * 1000.0) as i64;
        Some(((days * 24 + hh) * 60 + mm) * 60_000 + ms)
    };
    parse().unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::{super::E2bConfig, ApiKey, rfc3339_ms};

    #[test]
    fn key_is_redacted_and_timestamps_parse() {
        let c = E2bConfig {
            api_key: Some(ApiKey::new("e2b_secret_123")),
            ..E2bConfig::default()
        };
        assert!(!format!("{c:?}").contains("e2b_secret_123"));
        assert_eq!(rfc3339_ms("1970-01-01T00:00:01Z"), 1000);
        assert_eq!(rfc3339_ms("2024-01-01T00:00:00.5Z"), 1_704_067_200_500);
    }
}
