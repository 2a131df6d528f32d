//! End to end: private repositories. The operator gives the mesh git credentials per
//! tenant and host (`FORKYARD_GIT_CREDENTIALS`, the gateway's and the provisioner's
//! alone); a tenant's run on a private repository then reads it and every fork gets a
//! clone of it, over HTTPS-style basic auth (git's own `http-backend` behind lighttpd)
//! and over SSH with a deploy key and a required host key (sshd; `ssh://` with a port,
//! and git's scp-like `root@host:path`, which has none: that sshd listens on port 22 of
//! a loopback address of the test's own). A tenant without a credential for the host,
//! or with one the host refuses, or whose known hosts lack the sshd's key (another key,
//! or none: never trusted on first use), is told so at launch; a URL carrying a token is
//! refused without being echoed; a rotated token is used at the next run with no
//! restart. And the secret is nowhere a tenant, an agent or an operator's tooling could
//! read it: not in the sandbox (its environment, its git config, its files), the patch,
//! the API's answers, the services' logs or Temporal's history.

// Shared by the suites that call as tenants; each uses part of it.
#[allow(dead_code)]
mod tenant_calls;

use forkyard_proto::{
    common::v1::{ForkResult, ForkStatus},
    gateway::v1::{LaunchRunRequest, Run, RunState},
};
use forkyard_tests::{
    Mesh,
    git_server::{GitHttp, GitSsh, git_mesh},
    leaks::{History, history, log_files},
    repo,
    support::{sandbox_processes, workspaces_left},
    token_scan::{assert_absent, fresh_token, spellings},
};
use std::path::Path;
use tenant_calls::{Gw, launch_req, list_ids, new_key, run_as, with_key};
use tonic::Code;

/// What an agent could find of a credential: its environment, the workspace's git
/// configuration, and every file of its home and workspace that names the host. All of
/// it goes into the patch, where the test looks for the secret.
const SNOOP: &str = r#"{ env; git config --list --show-origin; cat .git/config;
  grep -rs "" "$HOME" 2>/dev/null | head -c 200000; } > seen.txt 2>&1
echo "fork $FORKYARD_FORK" > done.txt
printf '{"total_cost_usd": 0.001}\n'"#;

/// A loopback address of this test's own (127.x.y.z): git's scp-like form has no port,
/// so its sshd listens on port 22, which another test's may hold on 127.0.0.1.
fn own_loopback() -> String {
    use std::hash::{BuildHasher as _, RandomState};
    let r = RandomState::new()
        .hash_one(std::process::id())
        .to_le_bytes();
    format!("127.{}.{}.{}", 1 + r[0] % 250, r[1], 1 + r[2] % 250)
}

fn credentials_file(
    dir: &Path,
    (http, ssh, scp): (&GitHttp, &GitSsh, &GitSsh),
    token: &Path,
) -> std::path::PathBuf {
    let file = dir.join("git-credentials.toml");
    // Teams D and E hold the right deploy key but not the sshd's host key: D another
    // server's key under this server's name, E no key for it at all (where trust on
    // first use would take whatever the server shows).
    let (other_key, no_key) = (dir.join("known_hosts-other"), dir.join("known_hosts-none"));
    let scp_host_key = std::fs::read_to_string(scp.known_hosts()).unwrap();
    let (_, key) = scp_host_key.split_once(' ').unwrap();
    std::fs::write(&other_key, format!("[127.0.0.1]:{} {key}\n", ssh.port)).unwrap();
    std::fs::write(&no_key, "").unwrap();
    let text = format!(
        r#"[[credential]]
host = "127.0.0.1:{http}"
tenants = ["team-a"]
username = "forkyard"
token_file = "{token}"

[[credential]]
host = "127.0.0.1:{http}"
tenants = ["team-c"]
username = "forkyard"
token = "not-the-token"

[[credential]]
host = "127.0.0.1:{ssh}"
tenants = ["team-a"]
ssh_key_file = "{key}"
known_hosts_file = "{known}"

[[credential]]
host = "{scp_host}"
tenants = ["team-a"]
ssh_key_file = "{scp_key}"
known_hosts_file = "{scp_known}"

[[credential]]
host = "127.0.0.1:{ssh}"
tenants = ["team-d"]
ssh_key_file = "{key}"
known_hosts_file = "{other_key}"

[[credential]]
host = "127.0.0.1:{ssh}"
tenants = ["team-e"]
ssh_key_file = "{key}"
known_hosts_file = "{no_key}"
"#,
        http = http.port,
        ssh = ssh.port,
        token = token.display(),
        key = ssh.key().display(),
        known = ssh.known_hosts().display(),
        other_key = other_key.display(),
        no_key = no_key.display(),
        scp_host = scp.addr,
        scp_key = scp.key().display(),
        scp_known = scp.known_hosts().display(),
    );
    std::fs::write(&file, text).unwrap();
    file
}

async fn mesh(hosts: &str, credentials: &Path) -> Mesh {
    git_mesh(hosts, credentials, Vec::new()).await
}

fn on(repo_url: &str, request_id: &str, forks: u32) -> LaunchRunRequest {
    let mut req = launch_req(Path::new("/unused"), request_id, SNOOP);
    req.repo = repo_url.to_owned();
    req.forks = forks;
    req.max_concurrent = forks;
    req
}

async fn launch_error(gw: &mut Gw, key: &str, req: LaunchRunRequest) -> tonic::Status {
    gw.launch_run(with_key(key, req))
        .await
        .expect_err("refused")
}

fn assert_completed((run, results): &(Run, Vec<ForkResult>), forks: usize) {
    assert_eq!(run.state, RunState::Completed as i32, "{run:#?}");
    assert_eq!(results.len(), forks, "{run:#?}");
    for f in results {
        assert_eq!(f.status, ForkStatus::Succeeded as i32, "{f:#?}");
        assert!(f.patch.contains("done.txt"), "{}", f.patch);
    }
}

/// A tenant whose credential knows another host key than the sshd's, or none for it,
/// is refused at launch naming the host and itself, and nothing starts; the sshd's key is
/// never taken on first use (no known_hosts file gains it).
async fn host_key_unknown_is_refused(
    mesh: &Mesh,
    gw: &mut Gw,
    team: &str,
    ssh: &GitSsh,
    dir: &Path,
) {
    let (_, key) = new_key(mesh, team);
    let known: Vec<_> = ["known_hosts-other", "known_hosts-none"]
        .map(|f| std::fs::read_to_string(dir.join(f)).unwrap())
        .into();
    let err = launch_error(gw, &key, on(&ssh.url(), &format!("{team}-ssh"), 1)).await;
    assert_eq!(err.code(), Code::FailedPrecondition, "{team}: {err:?}");
    let says = err.message();
    assert!(
        says.contains("127.0.0.1") && says.contains(team) && says.contains("host key"),
        "{team}: {says}"
    );
    assert!(list_ids(gw, &key).await.is_empty(), "{team}: a run started");
    let after: Vec<_> = ["known_hosts-other", "known_hosts-none"]
        .map(|f| std::fs::read_to_string(dir.join(f)).unwrap())
        .into();
    assert_eq!(after, known, "{team}: a known_hosts file was written");
    let home = std::env::var("HOME").unwrap_or_default();
    let user_known = std::fs::read_to_string(Path::new(&home).join(".ssh/known_hosts"));
    let name = format!("[127.0.0.1]:{}", ssh.port);
    assert!(
        !user_known.unwrap_or_default().contains(&name),
        "{team}: trusted on first use"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn private_repositories_are_cloned_with_the_tenants_credentials_which_never_leave_the_mesh() {
    let src = tempfile::tempdir().unwrap();
    repo::create(src.path()).unwrap();
    let secrets_dir = tempfile::tempdir().unwrap();
    let token = fresh_token();
    let http = GitHttp::serve(src.path(), "forkyard", &token);
    let ssh = GitSsh::serve(src.path());
    let scp = GitSsh::serve_on(src.path(), &own_loopback(), 22);
    let token_file = secrets_dir.path().join("team-a-token");
    std::fs::write(&token_file, format!("{token}\n")).unwrap();
    let creds = credentials_file(secrets_dir.path(), (&http, &ssh, &scp), &token_file);
    let ssh_key = std::fs::read_to_string(ssh.key()).unwrap();
    let key_body = ssh_key.lines().nth(1).unwrap().to_owned();
    let scp_key = std::fs::read_to_string(scp.key()).unwrap();
    let scp_key_body = scp_key.lines().nth(1).unwrap().to_owned();

    let hosts = format!(
        "127.0.0.1:{},127.0.0.1:{},{}",
        http.port, ssh.port, scp.addr
    );
    let mesh = mesh(&hosts, &creds).await;
    let mut gw = Gw::new(mesh.channel("gateway").await.unwrap());
    let (_, a) = new_key(&mesh, "team-a");
    let (_, b) = new_key(&mesh, "team-b");
    let (_, c) = new_key(&mesh, "team-c");

    // Team A's own token over HTTP, its deploy key over SSH: every fork clones.
    let over_http = run_as(&mut gw, &a, on(&http.url(), "a-http", 2)).await;
    assert_completed(&over_http, 2);
    let over_ssh = run_as(&mut gw, &a, on(&ssh.url(), "a-ssh", 1)).await;
    assert_completed(&over_ssh, 1);
    // git's scp-like form, `root@host:path`, over SSH with the deploy key (port 22).
    let over_scp = run_as(&mut gw, &a, on(&scp.scp_url(), "a-scp", 1)).await;
    assert_completed(&over_scp, 1);

    // B has no credential for the host, C one the host refuses: each told which.
    let err = launch_error(&mut gw, &b, on(&http.url(), "b-http", 1)).await;
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(
        err.message().contains("tenant team-b has none"),
        "{}",
        err.message()
    );
    let err = launch_error(&mut gw, &c, on(&http.url(), "c-http", 1)).await;
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(
        err.message()
            .contains("refused tenant team-c's git credentials"),
        "{}",
        err.message()
    );
    // B cannot borrow A's deploy key either: SSH without a key of its own is refused.
    let err = launch_error(&mut gw, &b, on(&ssh.url(), "b-ssh", 1)).await;
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(
        err.message().contains("tenant team-b has none"),
        "{}",
        err.message()
    );
    for team in ["team-d", "team-e"] {
        host_key_unknown_is_refused(&mesh, &mut gw, team, &ssh, secrets_dir.path()).await;
    }

    // A token in the URL: refused, naming the field, never repeating it.
    let with_token = http
        .url()
        .replace("http://", &format!("http://forkyard:{token}@"));
    let err = launch_error(&mut gw, &a, on(&with_token, "a-in-url", 1)).await;
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(err.message().starts_with("repo:"), "{}", err.message());
    assert_absent("the refusal", err.message(), &spellings("forkyard", &token));

    // Rotation: the server takes a new token only; the file is rewritten; the next run
    // uses it with no restart.
    let rotated = fresh_token();
    http.set_password(&rotated);
    std::fs::write(&token_file, format!("{rotated}\n")).unwrap();
    let after = run_as(&mut gw, &a, on(&http.url(), "a-rotated", 1)).await;
    assert_completed(&after, 1);

    let mut secrets = spellings("forkyard", &token);
    secrets.extend(spellings("forkyard", &rotated));
    secrets.push(key_body);
    secrets.push(scp_key_body);
    for r in [&over_http, &over_ssh, &over_scp, &after] {
        assert_absent(
            "the run's answer (patches included)",
            &format!("{r:?}"),
            &secrets,
        );
        let f = &r.1[0];
        assert!(f.patch.contains("seen.txt"), "the snoop ran: {}", f.patch);
        assert!(f.patch.contains("FORKYARD_FORK"), "it saw its environment");
    }
    let logs = log_files(mesh.state_dir());
    let read = ["gateway", "sandbox-provisioner", "temporal"];
    for service in read {
        let wanted = format!("logs/{service}.log");
        assert!(
            logs.iter().any(|p| p.ends_with(&wanted)),
            "{service}: {logs:?}"
        );
    }
    for path in &logs {
        let text = String::from_utf8_lossy(&std::fs::read(path).unwrap()).into_owned();
        assert_absent(&path.display().to_string(), &text, &secrets);
    }
    for (r, url) in [
        (&over_http, http.url()),
        (&over_ssh, ssh.url()),
        (&after, http.url()),
    ] {
        let History { raw, decoded } = history(&mesh, &r.0.run_id);
        assert!(decoded.contains(&url), "the run's payloads were read");
        assert_absent("a Temporal payload", &decoded, &secrets);
        assert_absent("Temporal's history", &raw, &secrets);
    }
    assert!(workspaces_left(mesh.state_dir()).is_empty());
    assert!(sandbox_processes(mesh.state_dir()).is_empty());
}
