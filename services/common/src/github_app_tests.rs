//! A GitHub App's JWT and installation tokens, against the fake forge (which verifies the
//! JWT with the app's public key). Keys are made by openssl at test time.

use super::*;
use crate::fake_forge::{AppKey, FakeForge, generate_app_key};

const APP: &str = "424242";
const INSTALLATION: u64 = 77;

fn app(fake: &FakeForge, key: &AppKey) -> GitHubApp {
    GitHubApp {
        api: fake.github_api(),
        app_id: APP.into(),
        key_file: key.key_file.clone(),
        installation_id: INSTALLATION,
        repository: Some("app".into()),
    }
}

fn claims(jwt: &str) -> serde_json::Value {
    let part = jwt.split('.').nth(1).unwrap();
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(part)
        .unwrap();
    serde_json::from_slice(&bytes).unwrap()
}

#[test]
fn the_jwt_is_rs256_issued_a_minute_back_for_nine_minutes() {
    let dir = tempfile::tempdir().unwrap();
    let key = generate_app_key(dir.path(), "app", true);
    let pem = std::fs::read(&key.key_file).unwrap();
    let now = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    let jwt = jwt(APP, &pem, now).unwrap();
    let head = jwt.split('.').next().unwrap();
    let head = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(head)
        .unwrap();
    assert_eq!(head, br#"{"alg":"RS256","typ":"JWT"}"#);
    assert_eq!(
        claims(&jwt),
        serde_json::json!({"iat": 1_799_999_940_u64, "exp": 1_800_000_540_u64, "iss": 424242})
    );
    // A client id is a string.
    assert_eq!(
        claims(&jwt_for("Iv1.abc", &pem, now))["iss"],
        serde_json::json!("Iv1.abc")
    );
}

fn jwt_for(app_id: &str, pem: &[u8], now: SystemTime) -> String {
    jwt(app_id, pem, now).unwrap()
}

#[test]
fn a_key_that_cannot_sign_is_refused_without_quoting_it() {
    let not_rsa = b"-----BEGIN RSA PRIVATE KEY-----\nc2VjcmV0LWtleS1ieXRlcw==\n-----END RSA PRIVATE KEY-----\n";
    let e = jwt(APP, not_rsa, SystemTime::now()).unwrap_err();
    assert!(e.contains("refused"), "{e}");
    assert!(!e.contains("c2VjcmV0") && !e.contains("secret-key"), "{e}");
    let e = jwt(APP, b"not a pem file: hunter2", SystemTime::now()).unwrap_err();
    assert!(
        e.contains("not a pem private key") && !e.contains("hunter2"),
        "{e}"
    );
}

#[tokio::test]
async fn a_token_is_minted_once_and_reused_by_every_caller() {
    let dir = tempfile::tempdir().unwrap();
    let key = generate_app_key(dir.path(), "app", true);
    let fake = FakeForge::start("unused").await;
    fake.add_app(APP, &key.public_pem, INSTALLATION);
    let tokens = InstallationTokens::default();
    let app = app(&fake, &key);
    // Callers at once (forks cloning together) wait for the one mint.
    let all = futures::future::join_all((0..8).map(|_| tokens.token(&app))).await;
    let first = all[0].as_ref().unwrap().clone();
    assert!(all.iter().all(|t| t.as_ref().unwrap() == &first));
    assert_eq!(tokens.token(&app).await.unwrap(), first);
    let minted = fake.minted();
    assert_eq!(minted.len(), 1);
    assert_eq!(first.expose(), minted[0].token);
    assert!(first.expose().starts_with("ghs_"));
    // The fake took the JWT's claims: iat a minute back, exp nine minutes on.
    assert_eq!(minted[0].exp - minted[0].iat, 600);
    let seen = &fake.seen()[0];
    assert_eq!(seen.path, "/app/installations/77/access_tokens");
    assert_eq!(seen.accept.as_deref(), Some("application/vnd.github+json"));
    assert!(seen.user_agent.as_deref().unwrap().starts_with("forkyard/"));
}

#[tokio::test]
async fn each_repository_gets_a_token_scoped_to_it_alone() {
    let dir = tempfile::tempdir().unwrap();
    let key = generate_app_key(dir.path(), "app", true);
    let fake = FakeForge::start("unused").await;
    fake.add_app(APP, &key.public_pem, INSTALLATION);
    let tokens = InstallationTokens::default();
    let for_app = app(&fake, &key);
    let for_lib = GitHubApp {
        repository: Some("lib".into()),
        ..for_app.clone()
    };
    let app_token = tokens.token(&for_app).await.unwrap();
    let lib_token = tokens.token(&for_lib).await.unwrap();
    assert_ne!(app_token, lib_token);
    assert_eq!(tokens.token(&for_app).await.unwrap(), app_token);
    let scopes: Vec<_> = fake.minted().into_iter().map(|m| m.repositories).collect();
    assert_eq!(
        scopes,
        [Some(vec!["app".to_owned()]), Some(vec!["lib".to_owned()])]
    );
    // The forge holds each token to its repository: app's opens nothing on lib.
    let pulls = |repo: &str, token: &Secret| {
        reqwest::Client::new()
            .get(format!("{}/repos/org/{repo}/pulls", fake.url()))
            .bearer_auth(token.expose())
            .send()
    };
    assert_eq!(pulls("app", &app_token).await.unwrap().status(), 200);
    assert_eq!(pulls("lib", &app_token).await.unwrap().status(), 404);
    assert_eq!(pulls("lib", &lib_token).await.unwrap().status(), 200);
}

#[tokio::test]
async fn a_token_near_its_expiry_is_minted_again() {
    let dir = tempfile::tempdir().unwrap();
    // PKCS#8 this time.
    let key = generate_app_key(dir.path(), "app8", false);
    let fake = FakeForge::start("unused").await;
    fake.add_app(APP, &key.public_pem, INSTALLATION);
    let tokens = InstallationTokens::default();
    let app = app(&fake, &key);
    // Four minutes: under the five kept in hand, so each ask mints.
    fake.set_token_lifetime(Duration::from_secs(4 * 60));
    let one = tokens.token(&app).await.unwrap();
    let two = tokens.token(&app).await.unwrap();
    assert_ne!(one, two);
    assert_eq!(fake.minted().len(), 2);
    fake.set_token_lifetime(Duration::from_secs(60 * 60));
    let three = tokens.token(&app).await.unwrap();
    assert_eq!(tokens.token(&app).await.unwrap(), three);
    assert_eq!(fake.minted().len(), 3);
    let left = fake.minted()[2]
        .expires_at
        .duration_since(SystemTime::now())
        .unwrap();
    assert!(left > Duration::from_secs(59 * 60), "{left:?}");
}

#[tokio::test]
async fn the_fake_verifies_the_jwt_and_refusals_are_final_and_quote_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let key = generate_app_key(dir.path(), "app", true);
    let other = generate_app_key(dir.path(), "other", true);
    let fake = FakeForge::start("unused").await;
    // The app is known with another key: the signature does not verify.
    fake.add_app(APP, &other.public_pem, INSTALLATION);
    let e = mint(&app(&fake, &key)).await.unwrap_err();
    assert_eq!(e.status(), Some(401), "{e}");
    assert!(!e.is_retryable());
    let text = e.to_string();
    assert!(
        text.starts_with(
            "github installation token for app 424242, installation 77, repository app: http 401"
        ),
        "{text}"
    );
    assert!(text.contains("could not be decoded"), "{text}");
    assert!(!text.contains("eyJ"), "a JWT in {text}");
    // Signed right, for an installation that is not the app's.
    let fake = FakeForge::start("unused").await;
    fake.add_app(APP, &key.public_pem, INSTALLATION + 1);
    let e = mint(&app(&fake, &key)).await.unwrap_err();
    assert_eq!(e.status(), Some(404), "{e}");
    // A key file that is not there names the file, not its content.
    let mut missing = app(&fake, &key);
    missing.key_file = dir.path().join("gone.pem");
    let e = mint(&missing).await.unwrap_err();
    assert!(
        e.to_string().contains("gone.pem") && !e.is_retryable(),
        "{e}"
    );
}

#[tokio::test]
async fn a_mint_the_forge_fails_is_retryable_and_the_retry_mints() {
    let dir = tempfile::tempdir().unwrap();
    let key = generate_app_key(dir.path(), "app", true);
    let fake = FakeForge::start("unused").await;
    fake.add_app(APP, &key.public_pem, INSTALLATION);
    let tokens = InstallationTokens::default();
    fake.fail_next(1);
    let e = tokens.token(&app(&fake, &key)).await.unwrap_err();
    assert!(e.is_retryable() && e.status() == Some(502), "{e}");
    let token = tokens.token(&app(&fake, &key)).await.unwrap();
    assert_eq!(fake.minted().len(), 1);
    assert!(!format!("{tokens:?}").contains(token.expose()));
}

#[tokio::test]
async fn the_fake_refuses_a_jwt_expired_or_too_long_lived() {
    let dir = tempfile::tempdir().unwrap();
    let key = generate_app_key(dir.path(), "app", true);
    let pem = std::fs::read(&key.key_file).unwrap();
    let fake = FakeForge::start("unused").await;
    fake.add_app(APP, &key.public_pem, INSTALLATION);
    let url = format!(
        "{}/app/installations/{INSTALLATION}/access_tokens",
        fake.url()
    );
    let minute = Duration::from_secs(60);
    for (signed_at, says) in [
        (
            SystemTime::now() - 20 * minute,
            "('exp') must be a numeric value",
        ),
        (
            SystemTime::now() + 15 * minute,
            "('exp') is too far in the future",
        ),
    ] {
        let answer = reqwest::Client::new()
            .post(&url)
            .bearer_auth(jwt(APP, &pem, signed_at).unwrap())
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status().as_u16(), 401);
        let body = answer.text().await.unwrap();
        assert!(body.contains(says), "{body}");
    }
    assert!(fake.minted().is_empty());
}
