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
    basic: String,
    token: &'static str,
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
    if basic != f.basic || q.get("service").map(String::as_str) != Some("forkyard-test") {
        return StatusCode::UNAUTHORIZED.into_response();
    }
    axum::Json(serde_json::json!({ "token": f.token, "expires_in": 300 })).into_response()
}

async fn v2(State(f): State<Arc<Front>>, headers: HeaderMap, uri: Uri) -> Response {
    let bearer = format!("Bearer {}", f.token);
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
        basic: format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode("robot:t0ken-pass")
        ),
        token: "tok-5d2a",
        asked: Mutex::default(),
        http: reqwest::Client::new(),
    });
    let app = Router::new()
        .route("/token", get(token))
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
