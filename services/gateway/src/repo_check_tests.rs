use super::*;

/// The default tenant, with no git credentials.
fn nobody() -> Reader<'static> {
    static NONE: std::sync::LazyLock<GitCredentials> =
        std::sync::LazyLock::new(GitCredentials::none);
    Reader {
        tenant: "default",
        credentials: &NONE,
    }
}
use std::{
    net::TcpListener,
    path::Path,
    process::{Child, Command, Stdio},
};
use tonic::Code;

/// Any host with public addresses: the setting's default.
fn any() -> AllowedHosts {
    AllowedHosts::any_public(crate::repo_policy::GIT_HOSTS_SETTING)
}

#[tokio::test]
async fn missing_local_repo_is_invalid_argument() {
    let err = check_repo("/nonexistent/forkyard/repo", "", &any(), nobody())
        .await
        .unwrap_err();
    let status = tonic::Status::from(err);
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(status.message().starts_with("repo"));
}

#[tokio::test]
async fn a_directory_that_is_not_a_repo_is_failed_precondition() {
    let dir = tempfile::tempdir().unwrap();
    let status = tonic::Status::from(
        check_repo(dir.path().to_str().unwrap(), "", &any(), nobody())
            .await
            .unwrap_err(),
    );
    assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
}

#[tokio::test]
async fn base_refs_must_name_a_commit_of_the_repository() {
    let dir = tempfile::tempdir().unwrap();
    let repo = dir.path().to_str().unwrap();
    let git = |args: &[&str]| {
        let ok = std::process::Command::new("git")
            .args(["-C", repo])
            .args(args)
            .env("GIT_AUTHOR_NAME", "t")
            .env("GIT_AUTHOR_EMAIL", "t@t")
            .env("GIT_COMMITTER_NAME", "t")
            .env("GIT_COMMITTER_EMAIL", "t@t")
            .status()
            .unwrap()
            .success();
        assert!(ok, "git {args:?}");
    };
    git(&["init", "-q", "-b", "main"]);
    git(&["commit", "-q", "--allow-empty", "-m", "one"]);
    git(&["commit", "-q", "--allow-empty", "-m", "two"]);
    git(&["tag", "v1"]);
    for good in ["", "HEAD", "main", "v1", "HEAD~1", "main^"] {
        assert!(
            check_repo(repo, good, &any(), nobody()).await.is_ok(),
            "{good}"
        );
    }
    for bad in ["nope", "HEAD~5", "v2"] {
        let e = tonic::Status::from(check_repo(repo, bad, &any(), nobody()).await.unwrap_err());
        assert_eq!(e.code(), Code::InvalidArgument, "{bad}");
        assert!(e.message().starts_with("base_ref"), "{e:?}");
    }
    for bad in ["-x", "--upload-pack=x", "a b", "a\nb"] {
        assert!(crate::validate::check_base_ref(bad).is_err(), "{bad:?}");
    }
}

/// `git daemon` serving the repositories under `base` on a free loopback port; killed
/// when dropped.
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

fn git_daemon(base: &Path) -> Daemon {
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
            .arg(format!("--base-path={}", base.display()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("git daemon"),
        port,
    );
    // Ready once it accepts a connection.
    for _ in 0..400 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return daemon;
        }
        std::thread::sleep(std::time::Duration::from_millis(25));
    }
    panic!("git daemon did not start on port {port}");
}

/// A repository `<base>/r.git` with one commit on `main`.
fn served_repo(base: &Path) {
    let work = base.join("work");
    let run = |dir: &Path, args: &[&str]| {
        let ok = Command::new("git")
            .arg("-C")
            .arg(dir)
            .args(args)
            .env("GIT_AUTHOR_NAME", "t")
            .env("GIT_AUTHOR_EMAIL", "t@t")
            .env("GIT_COMMITTER_NAME", "t")
            .env("GIT_COMMITTER_EMAIL", "t@t")
            .status()
            .unwrap()
            .success();
        assert!(ok, "git {args:?}");
    };
    std::fs::create_dir_all(&work).unwrap();
    run(&work, &["init", "-q", "-b", "main"]);
    run(&work, &["commit", "-q", "--allow-empty", "-m", "one"]);
    run(base, &["clone", "-q", "--bare", "work", "r.git"]);
}

/// Whatever answers on a loopback port (a git server, a web server, nothing, sshd),
/// the caller learns only that the repository cannot be read: before, each gave
/// git's own error, and LaunchRun was a port scanner of the gateway's host.
#[tokio::test]
async fn loopback_repositories_are_refused_alike_and_read_once_listed() {
    let dir = tempfile::tempdir().unwrap();
    served_repo(dir.path());
    let daemon = git_daemon(dir.path());
    let web = TcpListener::bind("127.0.0.1:0").unwrap();
    let web_port = web.local_addr().unwrap().port();
    let closed = free_port();
    let served = format!("git://127.0.0.1:{}/r.git", daemon.1);
    let probes = [
        served.clone(),
        format!("git://127.0.0.1:{closed}/r.git"),
        format!("http://127.0.0.1:{web_port}/r.git"),
        format!("https://localhost:{}/r.git", daemon.1),
        "ssh://127.0.0.1:22/r.git".to_owned(),
        "git@127.0.0.1:r.git".to_owned(),
        "git://[::1]:9418/r.git".to_owned(),
    ];
    for repo in &probes {
        let e = tonic::Status::from(check_repo(repo, "", &any(), nobody()).await.unwrap_err());
        assert_eq!(e.code(), Code::FailedPrecondition, "{repo}: {e:?}");
        assert_eq!(
            e.message(),
            format!("repo: repository {repo} cannot be read"),
            "{repo}"
        );
    }

    // The operator lists the server: it is read, its refs are checked.
    let listed = |entries: &[String]| {
        AllowedHosts::parse(crate::repo_policy::GIT_HOSTS_SETTING, entries).unwrap()
    };
    let ours = listed(&[
        format!("127.0.0.1:{}", daemon.1),
        format!("127.0.0.1:{closed}"),
    ]);
    check_repo(&served, "main", &ours, nobody()).await.unwrap();
    let e = tonic::Status::from(
        check_repo(&served, "nope", &ours, nobody())
            .await
            .unwrap_err(),
    );
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(e.message().starts_with("base_ref"), "{e:?}");
    // Listed, but nothing there: the same one message.
    let down = format!("git://127.0.0.1:{closed}/r.git");
    let e = tonic::Status::from(check_repo(&down, "", &ours, nobody()).await.unwrap_err());
    assert_eq!(
        e.message(),
        format!("repo: repository {down} cannot be read")
    );
    // A host the list does not name is refused by name, before any connection.
    let e = tonic::Status::from(
        check_repo(&probes[2], "", &ours, nobody())
            .await
            .unwrap_err(),
    );
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("FORKYARD_ALLOWED_GIT_HOSTS"), "{e:?}");
    drop(web);
}

#[tokio::test]
async fn gits_program_running_transports_are_refused_as_bad_input() {
    for repo in [
        "fd::3",
        "ext::sh -c id",
        "foo::bar",
        "rsync://h/r",
        "ftp://h/r",
    ] {
        let e = tonic::Status::from(check_repo(repo, "", &any(), nobody()).await.unwrap_err());
        assert_eq!(e.code(), Code::InvalidArgument, "{repo}: {e:?}");
        assert!(e.message().starts_with("repo: "), "{repo}: {e:?}");
    }
}
