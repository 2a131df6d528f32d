//! Where a create's repository may be cloned from: a remote one only from a git host
//! the operator allows (`FORKYARD_ALLOWED_GIT_HOSTS`), at public addresses unless the
//! host is listed, any failure to read it one answer; git's transports that run programs
//! or read the provisioner's descriptors (`ext::`, `fd::`) never. Against a real
//! `git daemon` on a loopback port.

mod common;

use common::{fixture_with, git};
use forkyard_common::allowed_hosts::AllowedHosts;
use forkyard_proto::sandbox::v1::CreateSandboxRequest;
use forkyard_sandbox_provisioner::{config::GIT_HOSTS_SETTING, error::ProvisionerError};
use std::{
    net::TcpListener,
    path::Path,
    process::{Child, Command, Stdio},
    time::Duration,
};

/// `git daemon` serving the repositories under a directory; killed when dropped.
struct Daemon(Child, u16);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// `<dir>/r.git`, a bare clone of `repo`, served on a free loopback port.
fn serve(repo: &Path, dir: &Path) -> Daemon {
    git(
        dir,
        &["clone", "-q", "--bare", repo.to_str().unwrap(), "r.git"],
    );
    let port = free_port();
    let daemon = Daemon(
        Command::new("git")
            .args([
                "daemon",
                "--listen=127.0.0.1",
                "--export-all",
                "--reuseaddr",
            ])
            .arg(format!("--port={port}"))
            .arg(format!("--base-path={}", dir.display()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("git daemon"),
        port,
    );
    for _ in 0..400 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return daemon;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    panic!("git daemon did not start on port {port}");
}

fn hosts(list: &[String]) -> AllowedHosts {
    AllowedHosts::parse(GIT_HOSTS_SETTING, list).unwrap()
}

fn on_repo(repo: &str) -> CreateSandboxRequest {
    CreateSandboxRequest {
        backend: "local".into(),
        repo: repo.into(),
        branch: "forkyard-fork-1".into(),
        ..Default::default()
    }
}

#[tokio::test]
async fn loopback_repositories_are_refused_alike_and_cloned_once_listed() {
    let served = tempfile::tempdir().unwrap();
    let mut f = fixture_with(|_, _| {}).await;
    let daemon = serve(&f.repo, served.path());
    let url = format!("git://127.0.0.1:{}/r.git", daemon.1);
    let closed = format!("git://127.0.0.1:{}/r.git", free_port());
    for repo in [
        &url,
        &closed,
        &format!("http://localhost:{}/r.git", daemon.1),
    ] {
        match f.core.create(on_repo(repo)).await {
            Err(e @ ProvisionerError::RepoUnavailable(_)) => {
                assert_eq!(
                    e.to_string(),
                    format!("repository unavailable: {repo} cannot be read")
                );
            }
            other => panic!("{repo}: {other:?}"),
        }
    }
    assert!(f.sandbox_dirs().is_empty());

    // Listed: cloned. A closed port of a listed host: the same one answer.
    let listed = vec![format!("127.0.0.1:{}", daemon.1), "127.0.0.1".to_owned()];
    f = fixture_with(|_, c| c.git_hosts = hosts(&listed)).await;
    let sbx = f.core.create(on_repo(&url)).await.unwrap();
    let head = git(&served.path().join("r.git"), &["rev-parse", "HEAD"]);
    assert_eq!(sbx.base_commit, head);
    let out = f.sh(&sbx.id, "cat README.md").await;
    assert_eq!(out.stdout, "hello\nworld\n", "{out:?}");
    let e = f.core.create(on_repo(&closed)).await.unwrap_err();
    assert_eq!(
        e.to_string(),
        format!("repository unavailable: {closed} cannot be read")
    );

    // A host the list does not name: refused by name before anything is made.
    f = fixture_with(|_, c| c.git_hosts = hosts(&["github.com".to_owned()])).await;
    match f.core.create(on_repo(&url)).await {
        Err(ProvisionerError::InvalidArgument { field, reason }) => {
            assert_eq!(field, "repo");
            assert!(reason.contains("FORKYARD_ALLOWED_GIT_HOSTS"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
}

/// `fd::3` made the provisioner's git wait on its own descriptor until the clone
/// timeout; `ext::` runs a command. Refused as bad input before git runs (the short
/// clone timeout only bounds how long the old behaviour would take to fail).
#[tokio::test]
async fn gits_program_running_transports_are_refused_as_bad_input() {
    let f = fixture_with(|_, c| c.clone_timeout = Duration::from_secs(5)).await;
    for repo in [
        "fd::3",
        "fd::0,1",
        "ext::sh -c id",
        "foo::bar",
        "rsync://h/r.git",
    ] {
        match f.core.create(on_repo(repo)).await {
            Err(ProvisionerError::InvalidArgument { field, .. }) => assert_eq!(field, "repo"),
            other => panic!("{repo}: {other:?}"),
        }
    }
    assert!(f.sandbox_dirs().is_empty());
}
