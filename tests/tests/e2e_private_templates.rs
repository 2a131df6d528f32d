//! End to end: a run of 100 forks on a private repository clones it once, not once per
//! fork, and the clone it keeps (the provisioner's workspace template) is served only to
//! a tenant whose own credential reads the repository now. Against git's `http-backend`
//! behind lighttpd with basic auth, speaking git's protocol v0 so that the server's
//! access log counts fetches (each `git-upload-pack` POST is one; an `ls-remote` is a
//! GET of `info/refs`). The provisioner is also asked directly, as a tenant, for a
//! sandbox of the repository whose template exists: a tenant the server refuses, and
//! the run's own tenant once the server stopped taking its token, are both refused.

// Shared by the suites that call as tenants; each uses part of it.
#[allow(dead_code)]
mod tenant_calls;

use forkyard_proto::{
    common::v1::ForkStatus,
    gateway::v1::RunState,
    sandbox::v1::{
        CreateSandboxRequest, DestroySandboxRequest,
        sandbox_provisioner_client::SandboxProvisionerClient,
    },
};
use forkyard_tests::{
    Mesh,
    git_server::{GitHttp, Protocol, git_mesh},
    repo,
    support::{sandbox_processes, workspaces_left},
};
use std::path::Path;
use tenant_calls::{Gw, launch_req, new_key, run_as};
use tonic::Code;

const AGENT: &str = r#"cat README.md > seen.txt
echo "fork $FORKYARD_FORK" > done.txt
printf '{"total_cost_usd": 0.001}\n'"#;

/// A run of this many forks clones its repository once.
const FORKS: u32 = 100;

fn credentials_file(dir: &Path, port: u16) -> std::path::PathBuf {
    let file = dir.join("git-credentials.toml");
    let text = format!(
        r#"[[credential]]
host = "127.0.0.1:{port}"
tenants = ["team-a"]
username = "forkyard"
token = "team-a-token"

[[credential]]
host = "127.0.0.1:{port}"
tenants = ["team-c"]
username = "forkyard"
token = "not-the-token"

[[credential]]
host = "127.0.0.1:{port}"
tenants = ["team-e"]
username = "team-e"
token = "team-e-token"
"#
    );
    std::fs::write(&file, text).unwrap();
    file
}

async fn mesh(hosts: &str, credentials: &Path) -> Mesh {
    git_mesh(hosts, credentials, Vec::new()).await
}

/// CreateSandbox asked of the provisioner itself, as `tenant` (what the gateway's run
/// workflow asks for each fork); the sandbox is destroyed again when it is made.
async fn create_as(mesh: &Mesh, tenant: &str, repo: &str) -> Result<(), tonic::Status> {
    let channel = mesh.channel("sandbox-provisioner").await.unwrap();
    let mut prov = SandboxProvisionerClient::new(channel);
    let made = prov
        .create_sandbox(CreateSandboxRequest {
            repo: repo.into(),
            branch: format!("direct-{tenant}"),
            tenant: tenant.into(),
            ..Default::default()
        })
        .await?
        .into_inner();
    prov.destroy_sandbox(DestroySandboxRequest {
        sandbox_id: made.id,
        reason: "test".into(),
    })
    .await
    .expect("destroy");
    Ok(())
}

fn assert_unreadable(status: &tonic::Status, url: &str) {
    assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
    assert_eq!(
        status.message(),
        format!("repository unavailable: {url} cannot be read")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_private_repository_is_cloned_once_a_run_and_its_clone_served_only_to_readers_now() {
    let src = tempfile::tempdir().unwrap();
    repo::create(src.path()).unwrap();
    let http = GitHttp::serve_many(
        &[("r", src.path())],
        "forkyard",
        "team-a-token",
        Protocol::V0,
    );
    http.add_user("team-e", "team-e-token");
    let secrets = tempfile::tempdir().unwrap();
    let creds = credentials_file(secrets.path(), http.port);
    let mesh = mesh(&format!("127.0.0.1:{}", http.port), &creds).await;
    let mut gw = Gw::new(mesh.channel("gateway").await.unwrap());
    let (_, a) = new_key(&mesh, "team-a");
    let url = http.url();

    // A hundred forks (the issue's size), fifty creates at once: one fetch.
    let mut req = launch_req(Path::new("/unused"), "a-hundred", AGENT);
    (req.repo, req.forks, req.max_concurrent) = (url.clone(), FORKS, 50);
    let (run, forks) = run_as(&mut gw, &a, req).await;
    assert_eq!(run.state, RunState::Completed as i32, "{run:#?}");
    assert_eq!(forks.len(), FORKS as usize);
    for f in &forks {
        assert_eq!(f.status, ForkStatus::Succeeded as i32, "{f:#?}");
        assert!(f.patch.contains("+# demo"), "{}", f.patch);
    }
    let fetched = http.fetches("r");
    assert_eq!(fetched, 1, "{:#?}", http.requests());

    // Team C's credential is refused by the server: refused at the create, as a clone
    // would be, without a fetch.
    let refused = create_as(&mesh, "team-c", &url).await.unwrap_err();
    assert_unreadable(&refused, &url);
    // Team E reads it with its own credential, and gets a clone of its own: templates
    // are the tenant's.
    create_as(&mesh, "team-e", &url).await.expect("team-e");
    assert_eq!(http.fetches("r"), 2);
    create_as(&mesh, "team-e", &url)
        .await
        .expect("team-e again");
    assert_eq!(http.fetches("r"), 2);

    // The server stops taking team A's token: its template is still there, and still
    // not served.
    http.set_password("rotated-elsewhere");
    let revoked = create_as(&mesh, "team-a", &url).await.unwrap_err();
    assert_unreadable(&revoked, &url);
    assert_eq!(http.fetches("r"), 2, "{:#?}", http.requests());

    assert!(workspaces_left(mesh.state_dir()).is_empty());
    assert!(sandbox_processes(mesh.state_dir()).is_empty());
}
