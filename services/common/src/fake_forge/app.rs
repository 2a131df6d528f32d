//! The fake's GitHub App: test keys made with openssl, and the token exchange, whose
//! JWT is checked as GitHub checks it (RS256 signature by the app's key, `iss`, `iat`,
//! an `exp` in the future and at most ten minutes ahead).

use super::{Grant, Shared, answer, enter, header, lock};
use axum::{
    body::Bytes,
    extract::{Path, State},
    http::{HeaderMap, Method, Uri},
    response::Response,
};
use base64::Engine as _;
use serde_json::{Value, json};
use std::{
    collections::HashMap,
    path::{Path as FsPath, PathBuf},
    process::Command,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

/// An app's key pair for a test: its private key's file and its public key's PEM.
#[derive(Debug, Clone)]
pub struct AppKey {
    pub key_file: PathBuf,
    pub public_pem: String,
}

/// A new 2048-bit RSA key in `dir`, `name.pem`, by `openssl genrsa`: PKCS#1 (`RSA PRIVATE
/// KEY`, as GitHub issues them) when `pkcs1`, else PKCS#8 (`PRIVATE KEY`), and its
/// public key (`RSA PUBLIC KEY`) for [`super::FakeForge::add_app`].
pub fn generate_app_key(dir: &FsPath, name: &str, pkcs1: bool) -> AppKey {
    let key_file = dir.join(format!("{name}.pem"));
    let mut genrsa = Command::new("openssl");
    genrsa.arg("genrsa");
    if pkcs1 {
        genrsa.arg("-traditional");
    }
    let status = genrsa
        .arg("-out")
        .arg(&key_file)
        .arg("2048")
        .output()
        .expect("run openssl genrsa");
    assert!(status.status.success(), "openssl genrsa: {status:?}");
    let public = Command::new("openssl")
        .arg("rsa")
        .arg("-in")
        .arg(&key_file)
        .arg("-RSAPublicKey_out")
        .output()
        .expect("run openssl rsa");
    assert!(public.status.success(), "openssl rsa: {public:?}");
    AppKey {
        key_file,
        public_pem: String::from_utf8(public.stdout).expect("a PEM"),
    }
}

/// A token the fake minted.
#[derive(Debug, Clone)]
pub struct Minted {
    pub app_id: String,
    pub installation_id: u64,
    pub token: String,
    pub expires_at: SystemTime,
    /// The JWT's claims it was minted for.
    pub iat: u64,
    pub exp: u64,
    /// The repositories the exchange asked it for (`None`: it named none, all of the
    /// installation's).
    pub repositories: Option<Vec<String>>,
}

pub(super) struct FakeApp {
    /// PKCS#1 `RSAPublicKey`, DER.
    public_der: Vec<u8>,
    pub installations: Vec<u64>,
}

impl FakeApp {
    pub fn new(public_pem: &str) -> Self {
        let base64: String = public_pem
            .lines()
            .filter(|l| !l.starts_with("-----"))
            .collect();
        let public_der = base64::engine::general_purpose::STANDARD
            .decode(base64.trim())
            .expect("an RSA PUBLIC KEY PEM");
        Self {
            public_der,
            installations: Vec::new(),
        }
    }
}

struct Claims {
    iss: String,
    iat: u64,
    exp: u64,
}

const UNDECODABLE: &str = "A JSON web token could not be decoded";
const BAD_EXP: &str = "'Expiration time' claim ('exp') must be a numeric value representing the future time at which the assertion expires";

fn decode_json(part: &str) -> Result<Value, &'static str> {
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(part)
        .map_err(|_| UNDECODABLE)?;
    serde_json::from_slice(&bytes).map_err(|_| UNDECODABLE)
}

/// The JWT's claims, if GitHub would take it at `now` (seconds since the epoch); `Err`:
/// GitHub's message.
fn verify(jwt: &str, apps: &HashMap<String, FakeApp>, now: u64) -> Result<Claims, &'static str> {
    let parts: Vec<&str> = jwt.split('.').collect();
    let [head, claims, signature] = parts[..] else {
        return Err(UNDECODABLE);
    };
    if decode_json(head)?.get("alg").and_then(Value::as_str) != Some("RS256") {
        return Err(UNDECODABLE);
    }
    let body = decode_json(claims)?;
    let iss = match body.get("iss") {
        Some(Value::Number(n)) => n.to_string(),
        Some(Value::String(s)) => s.clone(),
        _ => return Err("'Issuer' claim ('iss') must be an Integer"),
    };
    let app = apps.get(&iss).ok_or("Integration not found")?;
    let signature = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(signature)
        .map_err(|_| UNDECODABLE)?;
    ring::signature::UnparsedPublicKey::new(
        &ring::signature::RSA_PKCS1_2048_8192_SHA256,
        &app.public_der,
    )
    .verify(format!("{head}.{claims}").as_bytes(), &signature)
    .map_err(|_| UNDECODABLE)?;
    let iat = body.get("iat").and_then(Value::as_u64).ok_or(
        "'Issued at' claim ('iat') must be an Integer representing the time that the assertion was issued",
    )?;
    let exp = body.get("exp").and_then(Value::as_u64).ok_or(BAD_EXP)?;
    if exp <= now {
        return Err(BAD_EXP);
    }
    if exp > now + 600 || exp.saturating_sub(iat) > 600 {
        return Err("'Expiration time' claim ('exp') is too far in the future");
    }
    if iat > now + 60 {
        return Err("'Issued at' claim ('iat') must be an Integer representing a time in the past");
    }
    Ok(Claims { iss, iat, exp })
}

fn rfc3339(t: SystemTime) -> String {
    let secs = t.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs();
    chrono::DateTime::from_timestamp(i64::try_from(secs).unwrap_or(i64::MAX), 0)
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
        .unwrap_or_default()
}

/// `POST /app/installations/{id}/access_tokens`.
pub(super) async fn access_tokens(
    State(shared): State<Shared>,
    Path(installation_id): Path<u64>,
    (method, uri, headers): (Method, Uri, HeaderMap),
    body: Bytes,
) -> Response {
    let json: Option<Value> = serde_json::from_slice(&body).ok();
    if let Some(r) = enter(&shared, (&method, &uri, &headers), json.clone(), None) {
        return r;
    }
    let repositories = match json.as_ref().and_then(|j| j.get("repositories")) {
        None => None,
        Some(Value::Array(names)) if names.iter().all(Value::is_string) => Some(
            names
                .iter()
                .filter_map(|n| n.as_str().map(str::to_owned))
                .collect::<Vec<_>>(),
        ),
        Some(_) => {
            return answer(
                422,
                json!({"message": "Invalid request.\n\nFor 'properties/repositories', is not an array of strings."}),
            );
        }
    };
    let Some(jwt) = header(&headers, "authorization")
        .and_then(|v| v.strip_prefix("Bearer ").map(str::to_owned))
    else {
        return answer(401, json!({"message": "Requires authentication"}));
    };
    let now = SystemTime::now();
    let now_secs = now.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs();
    let mut inner = lock(&shared);
    let claims = match verify(&jwt, &inner.apps, now_secs) {
        Ok(claims) => claims,
        Err(message) => return answer(401, json!({"message": message})),
    };
    if !inner.apps[&claims.iss]
        .installations
        .contains(&installation_id)
    {
        return answer(404, json!({"message": "Not Found"}));
    }
    let lifetime = inner.token_lifetime.unwrap_or(Duration::from_secs(3600));
    let expires_at = UNIX_EPOCH + Duration::from_secs(now_secs) + lifetime;
    let token = format!(
        "ghs_fake{:04}x{:024}",
        inner.minted.len() + 1,
        now.duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos()
    );
    inner.tokens.insert(
        token.clone(),
        Grant {
            until: Some(expires_at),
            repositories: repositories.clone(),
        },
    );
    let minted = Minted {
        app_id: claims.iss,
        installation_id,
        token: token.clone(),
        expires_at,
        iat: claims.iat,
        exp: claims.exp,
        repositories,
    };
    inner.minted.push(minted.clone());
    // Told before the token is answered: a git server the test feeds takes it by then.
    let told = inner.on_mint.clone();
    drop(inner);
    if let Some(tell) = told {
        tell(&minted);
    }
    answer(
        201,
        json!({
            "token": token,
            "expires_at": rfc3339(expires_at),
            "permissions": {"contents": "write", "pull_requests": "write"},
            "repository_selection": "selected",
        }),
    )
}
