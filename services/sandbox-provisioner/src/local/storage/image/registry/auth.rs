//! A registry's credentials and challenges: the Docker `config.json` the operator's
//! credentials come from (keyed by host), and the answer to a registry's 401.

use crate::local::storage::image::error::ImageError;
use std::{collections::HashMap, path::Path};

#[derive(serde::Deserialize)]
struct DockerConfig {
    #[serde(default)]
    auths: HashMap<String, AuthEntry>,
}

#[derive(serde::Deserialize)]
struct AuthEntry {
    #[serde(default)]
    auth: String,
}

/// `host` → base64 `user:password`, from a Docker `config.json` (`docker login`'s, or a
/// Kubernetes image pull secret's).
pub(super) fn credentials(path: &Path) -> Result<HashMap<String, String>, String> {
    let raw = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let parsed: DockerConfig = serde_json::from_slice(&raw)
        .map_err(|e| format!("{}: not a Docker config.json: {e}", path.display()))?;
    Ok(parsed
        .auths
        .into_iter()
        .filter(|(_, a)| !a.auth.is_empty())
        .map(|(host, a)| (host_of(&host), a.auth))
        .collect())
}

/// A registry's 401 on a pull of `repository` from `host`, to be answered.
pub(super) struct Challenge<'a> {
    pub host: &'a str,
    pub repository: &'a str,
    /// The operator's credentials for `host`.
    pub basic: Option<&'a String>,
    /// The URL a bearer challenge's realm may be asked at, or why not (`super::reach`).
    pub realm: &'a (dyn Fn(&str) -> Result<reqwest::Url, ImageError> + Sync),
}

impl Challenge<'_> {
    /// The `Authorization` value that answers `challenge` (the 401's `WWW-Authenticate`):
    /// basic auth with the operator's credentials, or a bearer token from the auth
    /// service the registry names.
    pub(super) async fn authorize(
        &self,
        http: &reqwest::Client,
        challenge: &str,
    ) -> Result<String, ImageError> {
        let host = self.host;
        let (scheme, params) = challenge.split_once(' ').unwrap_or((challenge, ""));
        if scheme.eq_ignore_ascii_case("basic") {
            return self.basic.map(|b| format!("Basic {b}")).ok_or_else(|| {
                unavailable(format!(
                    "{host} asks for credentials and FORKYARD_REGISTRY_AUTH_FILE has none for it"
                ))
            });
        }
        if !scheme.eq_ignore_ascii_case("bearer") {
            return Err(unavailable(format!("{host} asks for {scheme} auth")));
        }
        self.bearer_token(http, &challenge_params(params))
            .await
            .map(|token| format!("Bearer {token}"))
    }

    /// A token from the auth service a bearer challenge (its `params`) names; the
    /// operator's credentials for the registry go with the request.
    async fn bearer_token(
        &self,
        http: &reqwest::Client,
        params: &HashMap<String, String>,
    ) -> Result<String, ImageError> {
        #[derive(serde::Deserialize)]
        struct Token {
            #[serde(default)]
            token: String,
            #[serde(default)]
            access_token: String,
        }
        let host = self.host;
        let realm = params.get("realm").ok_or_else(|| {
            unavailable(format!("{host} gave a bearer challenge without a realm"))
        })?;
        let realm = (self.realm)(realm)?;
        let mut query = Vec::new();
        if let Some(s) = params.get("service") {
            query.push(("service", s.clone()));
        }
        query.push((
            "scope",
            params
                .get("scope")
                .cloned()
                .unwrap_or_else(|| format!("repository:{}:pull", self.repository)),
        ));
        let mut req = http.get(realm).query(&query);
        if let Some(b) = self.basic {
            req = req.header(reqwest::header::AUTHORIZATION, format!("Basic {b}"));
        }
        let resp = req.send().await.map_err(|e| {
            tracing::warn!(registry = host, error = %error_chain(&e), "registry's auth service cannot be reached");
            unavailable(format!("the auth service of {host} cannot be reached"))
        })?;
        if !resp.status().is_success() {
            return Err(unavailable(format!(
                "the auth service of {host} answered {}",
                resp.status()
            )));
        }
        let t: Token = resp.json().await.map_err(|e| {
            tracing::warn!(registry = host, error = %e, "registry's auth service gave no token");
            unavailable(format!("the auth service of {host} gave no token"))
        })?;
        let token = if t.token.is_empty() {
            t.access_token
        } else {
            t.token
        };
        if token.is_empty() {
            return Err(unavailable(format!(
                "the auth service of {host} gave no token"
            )));
        }
        Ok(token)
    }
}

/// `realm="…",service="…",scope="…"` (values quoted, commas inside quotes kept).
fn challenge_params(s: &str) -> HashMap<String, String> {
    let mut out = HashMap::new();
    let mut rest = s.trim();
    while let Some((key, after)) = rest.split_once('=') {
        let key = key
            .trim()
            .trim_start_matches(',')
            .trim()
            .to_ascii_lowercase();
        let (value, tail) = if let Some(q) = after.strip_prefix('"') {
            match q.find('"') {
                Some(end) => (&q[..end], &q[end + 1..]),
                None => (q, ""),
            }
        } else {
            match after.find(',') {
                Some(end) => (&after[..end], &after[end..]),
                None => (after, ""),
            }
        };
        out.insert(key, value.to_owned());
        rest = tail.trim_start_matches(',').trim();
    }
    out
}

/// A `config.json` key (`https://index.docker.io/v1/`, `host:port`) as a host.
fn host_of(key: &str) -> String {
    let k = key
        .trim_start_matches("https://")
        .trim_start_matches("http://");
    let host = k.split('/').next().unwrap_or(k);
    match host {
        "index.docker.io" | "docker.io" => "registry-1.docker.io".into(),
        h => h.to_owned(),
    }
}

/// A registry (or its auth service) that cannot give what was asked.
pub(super) fn unavailable(what: impl std::fmt::Display) -> ImageError {
    ImageError::Registry(what.to_string())
}

/// An error with its sources, as one line.
pub(super) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(inner) = src {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        src = inner.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_challenges_are_read_with_their_quoted_commas() {
        let p = challenge_params(
            r#"realm="https://auth.example/token",service="registry.example",scope="repository:a/b:pull,push""#,
        );
        assert_eq!(p["realm"], "https://auth.example/token");
        assert_eq!(p["service"], "registry.example");
        assert_eq!(p["scope"], "repository:a/b:pull,push");
    }
}
