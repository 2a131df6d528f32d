//! Registry credentials from `FORKYARD_REGISTRY_AUTH_FILE` (a Docker `config.json`):
//! basic auth against a real `docker-registry` with an htpasswd file, and the bearer
//! token flow (challenge, auth service, token) through a token-checking front of a real
//! registry that speaks the distribution protocol's auth the way Docker Hub and GHCR do.

mod common;

use axum::{
    Router,
    extract::{Query, State},
    http::{HeaderMap, StatusCode, Uri, header},
    response::{IntoResponse, Response},
    routing::get,
};
use base64::Engine;
use common::{
    registry::{Registry, push, push_as, start_registry, start_registry_with},
    test_image::save_image,
};
use forkyard_common::allowed_hosts::AllowedHosts;
use forkyard_proto::sandbox::v1::CreateSandboxRequest;
use forkyard_sandbox_provisioner::error::ProvisionerError;
use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
};

/// A Docker `config.json` with `user:password` for `host`.
fn auth_file(dir: &Path, host: &str, user_password: &str) -> PathBuf {
    let path = dir.join(format!("config-{}.json", uuid::Uuid::new_v4().simple()));
    let auth = base64::engine::general_purpose::STANDARD.encode(user_password);
    std::fs::write(
        &path,
        format!(r#"{{"auths": {{"{host}": {{"auth": "{auth}"}}}}}}"#),
    )
    .unwrap();
    path
}

async fn create_on(auth: Option<PathBuf>, image: &str) -> Result<String, ProvisionerError> {
    create_listing(auth, None, image).await
}

/// With `allowed`: the registries the operator lists (instead of the tests' loopback).
async fn create_listing(
    auth: Option<PathBuf>,
    allowed: Option<&[String]>,
    image: &str,
) -> Result<String, ProvisionerError> {
    let f = common::fixture_with(|_, c| {
        c.registry.auth_file = auth;
        if let Some(list) = allowed {
            c.registry.allowed = AllowedHosts::parse("FORKYARD_ALLOWED_REGISTRIES", list).unwrap();
        }
    })
    .await;
    let sbx = f
        .core
        .create(CreateSandboxRequest {
            image: image.into(),
            ..f.request("on-image")
        })
        .await?;
    let out = f.sh(&sbx.id, "imagetool").await;
    assert!(f.sandbox_dirs().len() == 1);
    Ok(out.stdout)
}

fn refused_with(result: Result<String, ProvisionerError>, says: &str) {
    match result {
        Err(ProvisionerError::FailedPrecondition(m)) => assert!(m.contains(says), "{m}"),
        other => panic!("expected a refusal saying {says:?}: {other:?}"),
    }
}

#[tokio::test]
async fn basic_auth_from_the_auth_file_pulls_from_an_htpasswd_registry() {
    let dir = tempfile::tempdir().unwrap();
    let htpasswd = dir.path().join("htpasswd");
    let out = std::process::Command::new("htpasswd")
        .args(["-Bbn", "puller", "s3cret"])
        .output()
        .expect("htpasswd (Debian package apache2-utils; make deps installs it)");
    assert!(out.status.success());
    std::fs::write(&htpasswd, &out.stdout).unwrap();
    let registry = start_registry_with(dir.path(), Some(&htpasswd));
    save_image(dir.path(), "tool.tar", true);
    push_as(
        &registry,
        &dir.path().join("tool.tar"),
        "forkyard/tool:1",
        Some("puller:s3cret"),
    );
    let image = format!("{}/forkyard/tool:1", registry.addr);

    let good = auth_file(dir.path(), &registry.addr, "puller:s3cret");
    assert_eq!(
        create_on(Some(good), &image).await.unwrap(),
        "image tool from the image\n"
    );
    refused_with(
        create_on(None, &image).await,
        "FORKYARD_REGISTRY_AUTH_FILE has none",
    );
    let bad = auth_file(dir.path(), &registry.addr, "puller:wrong");
    refused_with(
        create_on(Some(bad), &image).await,
        "refused the credentials",
    );
    let log = std::fs::read_to_string(&registry.log).unwrap();
    assert!(!log.contains("s3cret"), "the registry logged the password");
}

/// The token front: `/v2/*` wants `Bearer <token>` and forwards to `backend`; `/token`
/// hands the token out for the right basic credentials and scope.
struct Front {
    backend: String,
    realm: String,
    /// What the auth service takes now, and the token it hands out for it (both
    /// rotated by a test: a token that expired, a password replaced).
    basic: Mutex<String>,
    token: Mutex<String>,
    asked: Mutex<Vec<HashMap<String, String>>>,
    http: reqwest::Client,
}

async fn token(
    State(f): State<Arc<Front>>,
    headers: HeaderMap,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    f.asked.lock().unwrap().push(q.clone());
    let basic = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    if basic != *f.basic.lock().unwrap()
        || q.get("service").map(String::as_str) != Some("forkyard-test")
    {
        return StatusCode::UNAUTHORIZED.into_response();
    }
    let token = f.token.lock().unwrap().clone();
    axum::Json(serde_json::json!({ "token": token, "expires_in": 300 })).into_response()
}

/// The identity token a registry's auth service takes in OAuth2's refresh grant (as
/// `docker login` stores one for registries that use them).
const REFRESH_TOKEN: &str = "refresh-7c1";

/// `POST /token`: OAuth2's refresh grant (a form), answered with an access token for
/// the right refresh token and service.
async fn refresh_grant(State(f): State<Arc<Front>>, body: axum::body::Bytes) -> Response {
    // The test's values need no percent-decoding (the scope's would; it is not checked).
    let form: HashMap<String, String> = String::from_utf8_lossy(&body)
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    f.asked.lock().unwrap().push(form.clone());
    let field = |k: &str| form.get(k).map(String::as_str);
    if field("grant_type") != Some("refresh_token")
        || field("refresh_token") != Some(REFRESH_TOKEN)
        || field("service") != Some("forkyard-test")
    {
        return StatusCode::UNAUTHORIZED.into_response();
    }
    let token = f.token.lock().unwrap().clone();
    axum::Json(serde_json::json!({ "access_token": token, "expires_in": 300 })).into_response()
}

async fn v2(State(f): State<Arc<Front>>, headers: HeaderMap, uri: Uri) -> Response {
    let bearer = format!("Bearer {}", f.token.lock().unwrap());
    if headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        != Some(&bearer)
    {
        let challenge = format!(
            r#"Bearer realm="{}",service="forkyard-test",scope="repository:forkyard/tool:pull""#,
            f.realm
        );
        return (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, challenge)],
        )
            .into_response();
    }
    let mut req = f.http.get(format!("http://{}{uri}", f.backend));
    if let Some(accept) = headers.get(header::ACCEPT) {
        req = req.header(header::ACCEPT, accept);
    }
    let resp = req.send().await.unwrap();
    let status = StatusCode::from_u16(resp.status().as_u16()).unwrap();
    let kind = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/octet-stream")
        .to_owned();
    let body = resp.bytes().await.unwrap();
    (status, [(header::CONTENT_TYPE, kind)], body).into_response()
}

fn basic_of(user_password: &str) -> String {
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(user_password)
    )
}

async fn start_front(backend: &Registry) -> (String, Arc<Front>) {
    start_front_with(backend, None).await
}

/// With `realm`: its challenge names that auth service instead of its own `/token`.
async fn start_front_with(backend: &Registry, realm: Option<String>) -> (String, Arc<Front>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let front = Arc::new(Front {
        backend: backend.addr.clone(),
        realm: realm.unwrap_or_else(|| format!("http://{addr}/token")),
        basic: Mutex::new(basic_of("robot:t0ken-pass")),
        token: Mutex::new("tok-5d2a".into()),
        asked: Mutex::default(),
        http: reqwest::Client::new(),
    });
    let app = Router::new()
        .route("/token", get(token).post(refresh_grant))
        .route("/v2/{*rest}", get(v2))
        .with_state(front.clone());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (addr, front)
}

#[tokio::test]
async fn a_bearer_challenge_is_answered_with_a_token_from_the_auth_service() {
    let dir = tempfile::tempdir().unwrap();
    let backend = start_registry(dir.path());
    save_image(dir.path(), "tool.tar", true);
    push(&backend, &dir.path().join("tool.tar"), "forkyard/tool:1");
    let (addr, front) = start_front(&backend).await;
    let image = format!("{addr}/forkyard/tool:1");

    let good = auth_file(dir.path(), &addr, "robot:t0ken-pass");
    assert_eq!(
        create_on(Some(good), &image).await.unwrap(),
        "image tool from the image\n"
    );
    {
        let asked = front.asked.lock().unwrap();
        // One token for the whole pull, for the scope the challenge named.
        assert_eq!(asked.len(), 1, "{asked:?}");
        assert_eq!(asked[0]["scope"], "repository:forkyard/tool:pull");
    }
    let bad = auth_file(dir.path(), &addr, "robot:nope");
    refused_with(create_on(Some(bad), &image).await, "answered 401");
}

/// A registry's challenge may send the provisioner, with the operator's credentials for
/// that registry, to any URL it names: here another port of the same address, a canary
/// auth service that must not be asked. It is asked once the operator lists it.
#[tokio::test]
async fn a_bearer_realm_on_another_port_is_not_asked_unless_listed() {
    let dir = tempfile::tempdir().unwrap();
    let backend = start_registry(dir.path());
    save_image(dir.path(), "tool.tar", true);
    push(&backend, &dir.path().join("tool.tar"), "forkyard/tool:1");
    let (canary_addr, canary) = start_front(&backend).await;
    let realm = format!("http://{canary_addr}/token");
    let (addr, front) = start_front_with(&backend, Some(realm)).await;
    let image = format!("{addr}/forkyard/tool:1");
    let creds = auth_file(dir.path(), &addr, "robot:t0ken-pass");

    let only_registry = [addr.clone()];
    match create_listing(Some(creds.clone()), Some(&only_registry), &image).await {
        Err(ProvisionerError::FailedPrecondition(m)) => {
            assert!(m.contains(&image) && m.contains("auth service"), "{m}");
            assert!(m.contains("FORKYARD_ALLOWED_REGISTRIES"), "{m}");
        }
        other => panic!("the realm on another port was followed: {other:?}"),
    }
    assert!(
        canary.asked.lock().unwrap().is_empty(),
        "the canary was asked"
    );
    assert!(front.asked.lock().unwrap().is_empty());

    let both = [addr.clone(), canary_addr];
    assert_eq!(
        create_listing(Some(creds), Some(&both), &image)
            .await
            .unwrap(),
        "image tool from the image\n"
    );
    assert_eq!(canary.asked.lock().unwrap().len(), 1);
}

/// The environment variable that tells a re-run of a test where its credential helper
/// is (and that it is the re-run).
const HELPER_DIR: &str = "FORKYARD_TEST_CREDENTIAL_HELPER_DIR";

/// `docker-credential-forkyard-test` in `dir`: answers `get` with user `robot` and the
/// password in `<dir>/password` now, as ECR's helper answers with a password that lasts
/// 12 hours; each call is counted in `<dir>/calls`.
fn write_helper(dir: &Path) {
    let d = dir.display();
    let script = format!(
        "#!/bin/sh\n[ \"$1\" = get ] || exit 1\nserver=$(cat)\necho \"$server\" >> \"{d}/calls\"\nprintf '{{\"ServerURL\":\"%s\",\"Username\":\"robot\",\"Secret\":\"%s\"}}' \"$server\" \"$(cat \"{d}/password\")\"\n"
    );
    let helper = dir.join("docker-credential-forkyard-test");
    std::fs::write(&helper, script).unwrap();
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&helper, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// The provisioner runs `docker-credential-<name>` from its PATH, as docker does; a
/// test cannot change its own PATH (the process's environment is shared), so it runs
/// itself again, alone, in a child whose PATH starts with the helper's directory.
fn rerun_with_helper_on_path(test: &str) {
    let dir = tempfile::tempdir().unwrap();
    write_helper(dir.path());
    let path = format!(
        "{}:{}",
        dir.path().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env("PATH", path)
        .env(HELPER_DIR, dir.path())
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && said.contains("1 passed"),
        "{said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A config whose `credHelpers` names the helper for the registry: it is asked at each
/// pull, so a credential it rotated (and the token it now earns) applies to the next
/// pull of the same provisioner, without a restart; the old one is refused meanwhile.
#[tokio::test]
async fn a_credential_helper_is_asked_at_each_pull_so_rotated_credentials_need_no_restart() {
    let Some(helper_dir) = std::env::var_os(HELPER_DIR).map(PathBuf::from) else {
        return rerun_with_helper_on_path(
            "a_credential_helper_is_asked_at_each_pull_so_rotated_credentials_need_no_restart",
        );
    };
    let dir = tempfile::tempdir().unwrap();
    let backend = start_registry(dir.path());
    save_image(dir.path(), "tool.tar", true);
    // A tag per pull: a tag pulled once is served from the cache for a while.
    for tag in 1..=3 {
        let name = format!("forkyard/tool:{tag}");
        push(&backend, &dir.path().join("tool.tar"), &name);
    }
    let (addr, front) = start_front(&backend).await;
    std::fs::write(helper_dir.join("password"), "t0ken-pass").unwrap();
    let config = dir.path().join("config.json");
    std::fs::write(
        &config,
        format!(r#"{{"credHelpers": {{"{addr}": "forkyard-test"}}}}"#),
    )
    .unwrap();
    let f = common::fixture_with(|_, c| c.registry.auth_file = Some(config)).await;
    let create = |tag: u32| CreateSandboxRequest {
        image: format!("{addr}/forkyard/tool:{tag}"),
        ..f.request(&format!("pull-{tag}"))
    };
    f.core
        .create(create(1))
        .await
        .expect("pulled with the helper's password");

    // The registry's password and token turn over (the old token expired); the helper
    // has the new password: the next pull, same provisioner, uses it.
    *front.basic.lock().unwrap() = basic_of("robot:n3w-pass");
    *front.token.lock().unwrap() = "tok-9e1f".into();
    std::fs::write(helper_dir.join("password"), "n3w-pass").unwrap();
    f.core
        .create(create(2))
        .await
        .expect("pulled with the rotated password");
    let calls = std::fs::read_to_string(helper_dir.join("calls")).unwrap();
    assert_eq!(
        calls.lines().collect::<Vec<_>>(),
        [addr.as_str(), addr.as_str()]
    );

    // A helper whose answer the registry refuses: the create says so, naming no secret.
    std::fs::write(helper_dir.join("password"), "stale-pass").unwrap();
    match f.core.create(create(3)).await {
        Err(ProvisionerError::FailedPrecondition(m)) => {
            assert!(
                m.contains("answered 401") && !m.contains("stale-pass"),
                "{m}"
            )
        }
        other => panic!("a refused credential was not said: {other:?}"),
    }
}

/// An `identitytoken` in the config (what `docker login` stores for registries that
/// hand out refresh tokens): exchanged at the auth service by OAuth2's refresh grant
/// for the pull's access token; a wrong one is refused, saying so without it.
#[tokio::test]
async fn an_identity_token_is_exchanged_by_the_refresh_grant() {
    let dir = tempfile::tempdir().unwrap();
    let backend = start_registry(dir.path());
    save_image(dir.path(), "tool.tar", true);
    push(&backend, &dir.path().join("tool.tar"), "forkyard/tool:1");
    let (addr, front) = start_front(&backend).await;
    let image = format!("{addr}/forkyard/tool:1");
    let config = |token: &str| {
        let path = dir.path().join(format!("identity-{token}.json"));
        let text = format!(r#"{{"auths": {{"{addr}": {{"identitytoken": "{token}"}}}}}}"#);
        std::fs::write(&path, text).unwrap();
        path
    };
    assert_eq!(
        create_on(Some(config(REFRESH_TOKEN)), &image)
            .await
            .unwrap(),
        "image tool from the image\n"
    );
    {
        let asked = front.asked.lock().unwrap();
        assert_eq!(asked.len(), 1, "{asked:?}");
        assert_eq!(asked[0]["grant_type"], "refresh_token");
        assert_eq!(asked[0]["client_id"], "forkyard");
    }
    match create_on(Some(config("refresh-stale")), &image).await {
        Err(ProvisionerError::FailedPrecondition(m)) => {
            assert!(
                m.contains("answered 401") && !m.contains("refresh-stale"),
                "{m}"
            )
        }
        other => panic!("a refused identity token was not said: {other:?}"),
    }
}
