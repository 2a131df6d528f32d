//! A registry's credentials and challenges: the Docker `config.json` the operator's
//! credentials come from, read with `docker_credential` at each pull (its `auths`,
//! `identitytoken`s, `credHelpers` and `credsStore`, the helpers run then), so a token a
//! helper refreshes (ECR's last 12 hours) or a rotated file applies to the next pull
//! without a restart; and the answer to a registry's 401.

use crate::local::storage::image::error::ImageError;
use base64::Engine as _;
use docker_credential::{CredentialRetrievalError, DockerCredential};
use std::{collections::HashMap, path::Path};

/// Longest a credential helper may take to answer.
const HELPER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// What the operator's config gives for one registry. Never logged.
pub(super) enum Credential {
    /// Base64 `user:password`, for basic auth or an auth service's token request.
    Basic(String),
    /// An OAuth2 refresh token (`identitytoken`, or a helper's `<token>` answer),
    /// exchanged at the auth service for an access token.
    IdentityToken(String),
}

/// At start: the file is there and is a Docker `config.json` (an object); its entries
/// are read at each pull.
pub(super) fn check_file(path: &Path) -> Result<(), String> {
    let raw = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    match serde_json::from_slice::<serde_json::Value>(&raw) {
        Ok(serde_json::Value::Object(_)) => Ok(()),
        Ok(_) => Err(format!(
            "{}: not a Docker config.json (an object)",
            path.display()
        )),
        Err(e) => Err(format!("{}: not a Docker config.json: {e}", path.display())),
    }
}

/// The credential the config at `path` gives for `host` now (a helper it names is run
/// now); `None` when it has none for the host.
pub(super) async fn credential(path: &Path, host: &str) -> Result<Option<Credential>, ImageError> {
    // Docker Hub's entry is keyed by its index's old URL, as `docker login` writes it.
    let server = match host {
        "registry-1.docker.io" => "https://index.docker.io/v1/".to_owned(),
        h => h.to_owned(),
    };
    let file = path.to_owned();
    let reading = tokio::task::spawn_blocking(move || {
        let f =
            std::fs::File::open(&file).map_err(|_| CredentialRetrievalError::ConfigReadError)?;
        docker_credential::get_credential_from_reader(std::io::BufReader::new(f), &server)
    });
    // A helper that never answers fails the pull, not the create for ever (its process
    // and the blocking thread waiting on it stay until it ends).
    let read = tokio::time::timeout(HELPER_TIMEOUT, reading)
        .await
        .map_err(|_| {
            unavailable(format!(
                "FORKYARD_REGISTRY_AUTH_FILE's credential helper for {host} did not answer within {} s",
                HELPER_TIMEOUT.as_secs()
            ))
        })?
        .map_err(|e| unavailable(format!("reading FORKYARD_REGISTRY_AUTH_FILE: {e}")))?;
    match read {
        Ok(DockerCredential::UsernamePassword(user, password)) => Ok(Some(Credential::Basic(
            base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}")),
        ))),
        Ok(DockerCredential::IdentityToken(token)) => Ok(Some(Credential::IdentityToken(token))),
        Err(CredentialRetrievalError::NoCredentialConfigured) => Ok(None),
        // A helper's output may hold anything: only its name is said.
        Err(CredentialRetrievalError::HelperFailure { helper, .. }) => Err(unavailable(format!(
            "the credential helper {helper} failed for {host}"
        ))),
        Err(other) => Err(unavailable(format!(
            "FORKYARD_REGISTRY_AUTH_FILE for {host}: {}",
            other.to_string().to_lowercase()
        ))),
    }
}

/// A registry's 401 on a pull of `repository` from `host`, to be answered.
pub(super) struct Challenge<'a> {
    pub host: &'a str,
    pub repository: &'a str,
    /// The operator's credential for `host`.
    pub credential: Option<&'a Credential>,
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
            return match self.credential {
                Some(Credential::Basic(b)) => Ok(format!("Basic {b}")),
                Some(Credential::IdentityToken(_)) => Err(unavailable(format!(
                    "{host} asks for basic auth and FORKYARD_REGISTRY_AUTH_FILE has an identity token for it"
                ))),
                None => Err(unavailable(format!(
                    "{host} asks for credentials and FORKYARD_REGISTRY_AUTH_FILE has none for it"
                ))),
            };
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
        // With an identity token, OAuth2's refresh grant (as Docker does); else a GET,
        // with basic credentials when there are some.
        let req = match self.credential {
            Some(Credential::IdentityToken(refresh)) => {
                query.push(("grant_type", "refresh_token".into()));
                query.push(("refresh_token", refresh.clone()));
                query.push(("client_id", "forkyard".into()));
                http.post(realm).form(&query)
            }
            Some(Credential::Basic(b)) => http
                .get(realm)
                .query(&query)
                .header(reqwest::header::AUTHORIZATION, format!("Basic {b}")),
            None => http.get(realm).query(&query),
        };
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
