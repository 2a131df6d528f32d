//! End to end: a private repository with private submodules. The superproject and one
//! submodule (a relative URL, `../lib.git`) live on one git server, another submodule
//! on a second server (an absolute URL); both demand basic auth (git's `http-backend`
//! behind lighttpd). The provisioner checks them out host-side with the tenant's
//! credential for each host, so every fork's agent reads their files without ever
//! holding a credential. A tenant with no credential is refused at launch; a tenant
//! that reads the superproject but has no credential for the second server gets forks
//! that fail naming the submodule, and so does a direct create.

// Shared by the suites that call as tenants; each uses part of it.
#[allow(dead_code)]
mod tenant_calls;

use forkyard_proto::{
    common::v1::ForkStatus,
    gateway::v1::{LaunchRunRequest, RunState},
    sandbox::v1::{CreateSandboxRequest, sandbox_provisioner_client::SandboxProvisionerClient},
};
use forkyard_tests::{
    Mesh,
    git_server::{GitHttp, Protocol, git_mesh},
    repo,
    support::{sandbox_processes, workspaces_left},
};
use std::{path::Path, process::Command};
use tenant_calls::{Gw, launch_req, new_key, run_as, with_key};
use tonic::Code;

const AGENT: &str = r#"cat libs/same/lib.txt libs/other/other.txt > seen.txt
printf '{"total_cost_usd": 0.001}\n'"#;

fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .output()
        .unwrap();
    assert!(out.status.success(), "git {args:?}: {out:?}");
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

/// A repository with one commit holding `<file>`; its commit.
fn one_file(dir: &Path, file: &str, text: &str) -> String {
    git(dir, &["init", "-q", "-b", "main"]);
    std::fs::write(dir.join(file), text).unwrap();
    git(dir, &["add", file]);
    let who = ["-c", "user.name=T", "-c", "user.email=t@example.com"];
    git(dir, &[&who[..], &["commit", "-q", "-m", file]].concat());
    git(dir, &["rev-parse", "HEAD"])
}

/// Add gitlinks `(path, url, commit)` and their `.gitmodules` to `repo`, committed.
fn add_submodules(repo: &Path, subs: &[(&str, &str, &str)]) {
    let mut modules = String::new();
    for (path, url, commit) in subs {
        modules.push_str(&format!(
            "[submodule \"{path}\"]\n\tpath = {path}\n\turl = {url}\n"
        ));
        let link = format!("160000,{commit},{path}");
        git(repo, &["update-index", "--add", "--cacheinfo", &link]);
    }
    std::fs::write(repo.join(".gitmodules"), modules).unwrap();
    git(repo, &["add", ".gitmodules"]);
    git(repo, &["commit", "-q", "-m", "submodules"]);
}

fn credentials_file(dir: &Path, first: u16, second: u16) -> std::path::PathBuf {
    let file = dir.join("git-credentials.toml");
    let text = format!(
        r#"[[credential]]
host = "127.0.0.1:{first}"
tenants = ["team-a", "team-d"]
username = "forkyard"
token = "first-token"

[[credential]]
host = "127.0.0.1:{second}"
tenants = ["team-a"]
username = "forkyard"
token = "second-token"
"#
    );
    std::fs::write(&file, text).unwrap();
    file
}

async fn mesh(hosts: &str, credentials: &Path) -> Mesh {
    git_mesh(hosts, credentials, Vec::new()).await
}

fn on(url: &str, request_id: &str, forks: u32) -> LaunchRunRequest {
    let mut req = launch_req(Path::new("/unused"), request_id, AGENT);
    (req.repo, req.forks, req.max_concurrent) = (url.to_owned(), forks, forks);
    req
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn private_submodules_are_checked_out_with_each_hosts_credential() {
    let src = tempfile::tempdir().unwrap();
    let (app, lib, other) = (
        src.path().join("app"),
        src.path().join("lib"),
        src.path().join("other"),
    );
    for d in [&app, &lib, &other] {
        std::fs::create_dir_all(d).unwrap();
    }
    let other_commit = one_file(&other, "other.txt", "from the second server\n");
    let second = GitHttp::serve_many(
        &[("other", &other)],
        "forkyard",
        "second-token",
        Protocol::Any,
    );
    let lib_commit = one_file(&lib, "lib.txt", "from the same server\n");
    repo::create(&app).unwrap();
    let other_url = second.url_of("other");
    add_submodules(
        &app,
        &[
            ("libs/same", "../lib.git", &lib_commit),
            ("libs/other", &other_url, &other_commit),
        ],
    );
    let first = GitHttp::serve_many(
        &[("app", &app), ("lib", &lib)],
        "forkyard",
        "first-token",
        Protocol::Any,
    );
    let secrets = tempfile::tempdir().unwrap();
    let creds = credentials_file(secrets.path(), first.port, second.port);
    let hosts = format!("127.0.0.1:{},127.0.0.1:{}", first.port, second.port);
    let mesh = mesh(&hosts, &creds).await;
    let mut gw = Gw::new(mesh.channel("gateway").await.unwrap());
    let (_, a) = new_key(&mesh, "team-a");
    let (_, b) = new_key(&mesh, "team-b");
    let (_, d) = new_key(&mesh, "team-d");
    let url = first.url_of("app");

    // Team A: both submodules' files, in every fork.
    let (done, forks) = run_as(&mut gw, &a, on(&url, "a-subs", 2)).await;
    assert_eq!(done.state, RunState::Completed as i32, "{done:#?}");
    for f in &forks {
        assert_eq!(f.status, ForkStatus::Succeeded as i32, "{f:#?}");
        assert!(
            f.patch.contains("+from the same server")
                && f.patch.contains("+from the second server"),
            "{}",
            f.patch
        );
        // The submodules are the base's, not the fork's change.
        assert!(!f.patch.contains("libs/"), "{}", f.patch);
    }

    // Team B has no credential at all: refused at launch.
    let err = gw
        .launch_run(with_key(&b, on(&url, "b-subs", 1)))
        .await
        .expect_err("refused");
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");

    // Team D reads the superproject but not the second server: its fork fails naming
    // the submodule, and so does a create asked of the provisioner directly.
    let (_, forks) = run_as(&mut gw, &d, on(&url, "d-subs", 1)).await;
    assert_eq!(
        forks[0].status,
        ForkStatus::Failed as i32,
        "{:#?}",
        forks[0]
    );
    assert!(
        forks[0]
            .error
            .contains("submodule libs/other cannot be read"),
        "{:#?}",
        forks[0]
    );
    let channel = mesh.channel("sandbox-provisioner").await.unwrap();
    let refused = SandboxProvisionerClient::new(channel)
        .create_sandbox(CreateSandboxRequest {
            repo: url.clone(),
            branch: "direct".into(),
            tenant: "team-d".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    assert_eq!(
        refused.message(),
        "repository unavailable: submodule libs/other cannot be read"
    );
    for text in [refused.message(), &forks[0].error] {
        assert!(!text.contains("token"), "{text}");
    }

    assert!(workspaces_left(mesh.state_dir()).is_empty());
    assert!(sandbox_processes(mesh.state_dir()).is_empty());
}
