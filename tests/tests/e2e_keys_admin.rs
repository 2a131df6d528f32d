//! End to end: API keys managed through the gateway's admin API (`ApiKeys`) with the
//! real `forkyard keys` CLI, as an operator does once the first admin key exists. Two
//! gateway replicas share the key store (the state directory's SQLite file here; the
//! ledger's PostgreSQL in production, whose store test runs in `make
//! test-ledger-postgres`): a key made through one works on both, and a key revoked
//! through one is refused by the other at its very next call. A tenant that is not an
//! admin is refused the API; bad input names its field.

// Shared by the suites that call as tenants; each uses part of it.
#[allow(dead_code)]
mod tenant_calls;

use forkyard_proto::gateway::v1::{
    CreateApiKeyRequest, ListRunsRequest, api_keys_client::ApiKeysClient,
    gateway_client::GatewayClient,
};
use forkyard_tests::{
    Mesh,
    mesh::{MeshOptions, bin_dir},
};
use tenant_calls::{new_key, with_key};
use tonic::{Code, transport::Channel};

/// `forkyard -o json keys args…` against `gateway` as `key`: (exit code, stdout, stderr).
fn keys_cli(gateway: &str, key: &str, args: &[&str]) -> (Option<i32>, String, String) {
    let config = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(bin_dir().join("forkyard"))
        .env("FORKYARD_CONFIG", config.path().join("config.toml"))
        .env("FORKYARD_GATEWAY", gateway)
        .env("FORKYARD_API_KEY", key)
        // The default state dir is nowhere near the mesh's: the CLI cannot have used the
        // key file itself.
        .env("FORKYARD_STATE_DIR", config.path())
        .args(["-o", "json", "keys"])
        .args(args)
        .output()
        .expect("run forkyard");
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (out.status.code(), text(&out.stdout), text(&out.stderr))
}

async fn channel(endpoint: &str) -> Channel {
    Channel::from_shared(endpoint.to_owned())
        .unwrap()
        .connect()
        .await
        .expect("connect")
}

/// Whether `key` is let in by the gateway at `endpoint` (a ListRuns), or refused as
/// unauthenticated.
async fn admitted(endpoint: &str, key: &str) -> bool {
    let mut gw = GatewayClient::new(channel(endpoint).await);
    match gw
        .list_runs(with_key(key, ListRunsRequest::default()))
        .await
    {
        Ok(_) => true,
        Err(s) if s.code() == Code::Unauthenticated => false,
        Err(s) => panic!("ListRuns on {endpoint}: {s:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_are_made_listed_and_revoked_through_the_api_on_every_replica_at_once() {
    let admin_tenants = (
        "gateway".to_owned(),
        "FORKYARD_ADMIN_TENANTS".to_owned(),
        "ops".to_owned(),
    );
    let mut mesh = Mesh::start_with(MeshOptions {
        api_keys: true,
        service_env: vec![admin_tenants],
        ..Default::default()
    })
    .await
    .expect("mesh starts");
    // The first admin key, made on the host (`forkyard keys create`, no API key).
    let (_, admin) = new_key(&mesh, "ops");
    let (a, b) = (
        mesh.endpoint("gateway"),
        mesh.start_gateway_replica("gateway-b").await.unwrap(),
    );

    // Made through replica A, by the CLI, with the admin key.
    let (code, out, err) = keys_cli(
        &a,
        &admin,
        &["create", "--tenant", "team-a", "--name", "ci"],
    );
    assert_eq!(code, Some(0), "{err}");
    let made: serde_json::Value = serde_json::from_str(&out).expect("json");
    let (id, key) = (made["id"].as_str().unwrap(), made["key"].as_str().unwrap());
    assert_eq!(
        (made["tenant"].as_str(), made["name"].as_str()),
        (Some("team-a"), Some("ci"))
    );
    assert!(admitted(&a, key).await && admitted(&b, key).await);
    // Listed through replica B, without secrets.
    let (code, out, err) = keys_cli(&b, &admin, &["list"]);
    assert_eq!(code, Some(0), "{err}");
    let listed: Vec<serde_json::Value> = serde_json::from_str(&out).expect("json");
    let tenants: Vec<_> = listed
        .iter()
        .map(|k| k["tenant"].as_str().unwrap())
        .collect();
    assert_eq!(tenants, ["ops", "team-a"], "{out}");
    assert!(
        !out.contains(key.rsplit('_').next().unwrap()),
        "a secret listed: {out}"
    );

    // Revoked through B: A refuses it at its next call.
    let (code, out, err) = keys_cli(&b, &admin, &["revoke", id]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains(id), "{out}");
    assert!(
        !admitted(&a, key).await,
        "replica A still takes a revoked key"
    );
    assert!(!admitted(&b, key).await);

    // A tenant that is no admin is refused the API, naming why; nothing is made.
    let (_, tenant_key) = new_key(&mesh, "team-b");
    let (code, _, err) = keys_cli(&a, &tenant_key, &["create", "--tenant", "team-c"]);
    assert_ne!(code, Some(0));
    assert!(err.contains("may not manage api keys"), "{err}");
    let mut api = ApiKeysClient::new(channel(&a).await);
    let refused = api
        .create_api_key(with_key(
            &tenant_key,
            CreateApiKeyRequest {
                tenant: "team-c".into(),
                name: String::new(),
            },
        ))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");
    // Bad input names its field; an unknown key is NOT_FOUND.
    let bad = api
        .create_api_key(with_key(
            &admin,
            CreateApiKeyRequest {
                tenant: "Team C".into(),
                name: String::new(),
            },
        ))
        .await
        .unwrap_err();
    assert_eq!(bad.code(), Code::InvalidArgument, "{bad:?}");
    assert!(bad.message().starts_with("tenant:"), "{bad:?}");
    let (code, _, err) = keys_cli(&a, &admin, &["revoke", "0123456789abcdef"]);
    assert_ne!(code, Some(0));
    assert!(err.contains("not found"), "{err}");
    let (_, out, _) = keys_cli(&a, &admin, &["list"]);
    assert!(!out.contains("team-c"), "{out}");
}
