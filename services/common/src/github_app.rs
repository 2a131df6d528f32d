//! GitHub App installation tokens: what a `[[credential]]` entry with `app_id`,
//! `app_key_file` and `installation_id` gives git (username `x-access-token`) and the
//! pull-request API.
//!
//! The app's private key stays on the mesh's host: it signs a JWT (RS256, `iss` the app,
//! valid from a minute ago for nine minutes, under GitHub's ten), which is exchanged by
//! `POST {api}/app/installations/{id}/access_tokens` for an installation token that
//! expires within the hour. Each token is scoped to the one repository it is minted
//! for (`"repositories": [name]` in the exchange): an installation that can read a whole
//! organisation still hands a run a token that reads only the run's repository, so one
//! leaked (or one a bug sent to the wrong place) reaches nothing else. Tokens are cached
//! per app, installation and repository and minted again once fewer than five minutes of
//! one remain, so a run that starts with one never sees it expire under a clone. The key
//! file is read at each mint: a rotated key applies at once.

use crate::{
    forge::{
        Forge, ForgeError, github,
        http::{Call, endpoint},
    },
    secret::Secret,
};
use base64::Engine as _;
use ring::signature::RsaKeyPair;
use rustls::pki_types::{PrivateKeyDer, pem::PemObject};
use serde::Deserialize;
use std::{
    collections::HashMap,
    path::PathBuf,
    sync::{Arc, Mutex},
    time::{Duration, SystemTime, UNIX_EPOCH},
};

/// A token with less than this left is minted again.
pub const REFRESH_BEFORE: Duration = Duration::from_secs(5 * 60);
/// A JWT's `iat` is set this far back, for a clock on GitHub's side that runs behind.
const JWT_BACKDATE: Duration = Duration::from_secs(60);
/// And its `exp` this far ahead (GitHub takes at most ten minutes).
const JWT_LIFETIME: Duration = Duration::from_secs(9 * 60);

/// One app installation, as a credential entry names it, and the repository its tokens
/// are for.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct GitHubApp {
    /// The API's base (`https://api.github.com`, `https://ghe.corp/api/v3`).
    pub api: url::Url,
    /// The app's id (or client id): the JWT's `iss`.
    pub app_id: String,
    /// Its private key, PEM: PKCS#1 (`RSA PRIVATE KEY`, as GitHub issues them) or PKCS#8.
    pub key_file: PathBuf,
    pub installation_id: u64,
    /// The repository's name (`x` of `org/x`: GitHub scopes a token by names within the
    /// installation's account); `None` mints a token for every repository the
    /// installation has, which only a remote without a path gets.
    pub repository: Option<String>,
}

/// A minted installation token.
#[derive(Debug, Clone)]
pub struct InstallationToken {
    pub token: Secret,
    pub expires_at: SystemTime,
}

impl InstallationToken {
    /// Whether it has at least [`REFRESH_BEFORE`] left at `now`.
    pub fn fresh_at(&self, now: SystemTime) -> bool {
        self.expires_at
            .duration_since(now)
            .is_ok_and(|left| left >= REFRESH_BEFORE)
    }
}

/// The app's JWT at `now`, signed with the PEM key `key_pem`. `Err` says why the key
/// cannot sign, without any of it.
pub fn jwt(app_id: &str, key_pem: &[u8], now: SystemTime) -> Result<String, String> {
    let key = signing_key(key_pem)?;
    let now = now.duration_since(UNIX_EPOCH).unwrap_or_default();
    let iat = now.saturating_sub(JWT_BACKDATE).as_secs();
    let exp = (now + JWT_LIFETIME).as_secs();
    // GitHub's examples give an app id as a number, a client id as a string.
    let iss = match app_id.parse::<u64>() {
        Ok(n) => serde_json::Value::from(n),
        Err(_) => serde_json::Value::from(app_id),
    };
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let header = b64.encode(br#"{"alg":"RS256","typ":"JWT"}"#);
    let claims = b64.encode(serde_json::json!({"iat": iat, "exp": exp, "iss": iss}).to_string());
    let signed = format!("{header}.{claims}");
    let mut signature = vec![0; key.public().modulus_len()];
    key.sign(
        &ring::signature::RSA_PKCS1_SHA256,
        &ring::rand::SystemRandom::new(),
        signed.as_bytes(),
        &mut signature,
    )
    .map_err(|_| "the app key cannot sign".to_owned())?;
    Ok(format!("{signed}.{}", b64.encode(signature)))
}

fn signing_key(pem: &[u8]) -> Result<RsaKeyPair, String> {
    let refused = |e: ring::error::KeyRejected| format!("the app key is refused: {e}");
    match PrivateKeyDer::from_pem_slice(pem) {
        Ok(PrivateKeyDer::Pkcs1(k)) => RsaKeyPair::from_der(k.secret_pkcs1_der()).map_err(refused),
        Ok(PrivateKeyDer::Pkcs8(k)) => {
            RsaKeyPair::from_pkcs8(k.secret_pkcs8_der()).map_err(refused)
        }
        Ok(_) => Err("the app key is not an rsa key".into()),
        // The parser's error may quote the file: not repeated.
        Err(_) => {
            Err("the app key is not a pem private key (RSA PRIVATE KEY or PRIVATE KEY)".into())
        }
    }
}

/// Exchange a JWT for a new installation token.
pub async fn mint(app: &GitHubApp) -> Result<InstallationToken, ForgeError> {
    let what = format!(
        "installation token for app {}, installation {}{}",
        app.app_id,
        app.installation_id,
        app.repository
            .as_ref()
            .map(|r| format!(", repository {r}"))
            .unwrap_or_default()
    );
    let setup = |why: String| ForgeError::Setup(format!("github {what}: {why}"));
    let pem = tokio::fs::read(&app.key_file)
        .await
        .map_err(|e| setup(format!("app_key_file {}: {e}", app.key_file.display())))?;
    let jwt = Secret::new(jwt(&app.app_id, &pem, SystemTime::now()).map_err(setup)?);
    let call = Call {
        forge: Forge::GitHub,
        what: what.clone(),
        token: &jwt,
    };
    let installation = app.installation_id.to_string();
    let url = endpoint(
        &call,
        &app.api,
        &["app", "installations", &installation, "access_tokens"],
    )?;
    let mut request = github::request(&call, call.client()?.post(url))?;
    if let Some(repository) = &app.repository {
        request = request.json(&serde_json::json!({ "repositories": [repository] }));
    }
    let answer = call.send(request).await?;
    if !answer.status.is_success() {
        return Err(call.status_error(&answer));
    }
    #[derive(Deserialize)]
    struct Minted {
        token: String,
        expires_at: String,
    }
    let minted: Minted = call.json(&answer)?;
    let expires_at = chrono::DateTime::parse_from_rfc3339(&minted.expires_at)
        .ok()
        .and_then(|t| u64::try_from(t.timestamp()).ok())
        .map(|secs| UNIX_EPOCH + Duration::from_secs(secs))
        .ok_or_else(|| call.answer("expires_at is no rfc 3339 time".into()))?;
    Ok(InstallationToken {
        token: Secret::new(minted.token),
        expires_at,
    })
}

type Slot = Arc<tokio::sync::Mutex<Option<InstallationToken>>>;

/// Installation tokens, cached per app installation.
#[derive(Default)]
pub struct InstallationTokens {
    slots: Mutex<HashMap<GitHubApp, Slot>>,
}

impl std::fmt::Debug for InstallationTokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let n = self.slots.lock().map_or(0, |s| s.len());
        f.debug_struct("InstallationTokens")
            .field("installations", &n)
            .finish()
    }
}

impl InstallationTokens {
    /// A token for `app` with at least [`REFRESH_BEFORE`] left, minted if there is none.
    /// Callers asking at once wait for the one mint (a 100-fork run mints once).
    pub async fn token(&self, app: &GitHubApp) -> Result<Secret, ForgeError> {
        let slot = self
            .slots
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .entry(app.clone())
            .or_default()
            .clone();
        let mut held = slot.lock().await;
        if let Some(t) = held.as_ref().filter(|t| t.fresh_at(SystemTime::now())) {
            return Ok(t.token.clone());
        }
        let minted = mint(app).await?;
        let token = minted.token.clone();
        *held = Some(minted);
        Ok(token)
    }
}

#[cfg(test)]
#[path = "github_app_tests.rs"]
mod tests;
