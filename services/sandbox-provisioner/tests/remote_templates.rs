//! A remote repository's workspaces come from one template per commit (`local::storage::repo::remote`):
//! each create asks the remote what its base is now, the first one clones, the others
//! copy; its submodules (and theirs) are checked out host-side from the hosts the
//! operator allows, and a hostile `.gitmodules` (a local path, a relative URL that
//! climbs out of the host, a host not listed, nesting without end, a commit the server
//! lacks) fails the create naming the submodule. Against a real `git daemon` whose log
//! counts what was asked.

mod common;

use common::{fixture_with, git};
use forkyard_common::allowed_hosts::AllowedHosts;
use forkyard_proto::sandbox::v1::{CollectPatchRequest, CreateSandboxRequest};
use forkyard_sandbox_provisioner::{
    Provisioner, config::GIT_HOSTS_SETTING, error::ProvisionerError,
};
use std::{
    net::TcpListener,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::Arc,
    time::Duration,
};

/// `git daemon` serving the bare repositories under a directory, logging each request;
/// killed when dropped.
struct Daemon {
    child: Child,
    port: u16,
    log: PathBuf,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Daemon {
    fn serve(dir: &Path) -> Daemon {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let log = dir.join("daemon.log");
        let child = Command::new("git")
            .args([
                "daemon",
                "--listen=127.0.0.1",
                "--export-all",
                "--reuseaddr",
            ])
            .args(["--verbose", "--log-destination=stderr"])
            .arg(format!("--port={port}"))
            .arg(format!("--base-path={}", dir.display()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("git daemon");
        // Killed and reaped when dropped, a panic below included.
        let daemon = Daemon { child, port, log };
        for _ in 0..400 {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return daemon;
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        panic!("git daemon did not start on port {port}");
    }

    fn url(&self, name: &str) -> String {
        format!("git://127.0.0.1:{}/{name}.git", self.port)
    }

    /// How many times `name` was asked for (an ls-remote, a clone or a fetch each).
    fn asked(&self, name: &str) -> usize {
        let want = format!("Request upload-pack for '/{name}.git'");
        let log = std::fs::read_to_string(&self.log).unwrap();
        log.lines().filter(|l| l.contains(&want)).count()
    }
}

/// A repository at `<dir>/<name>` with one file, `<name>.txt`; its commit.
fn plain_repo(dir: &Path, name: &str) -> String {
    let repo = dir.join(name);
    std::fs::create_dir_all(&repo).unwrap();
    git(&repo, &["init", "-q", "-b", "main"]);
    git(&repo, &["config", "user.name", "Test"]);
    git(&repo, &["config", "user.email", "test@example.com"]);
    std::fs::write(repo.join(format!("{name}.txt")), format!("{name}\n")).unwrap();
    git(&repo, &["add", "."]);
    git(&repo, &["commit", "-q", "-m", name]);
    git(&repo, &["rev-parse", "HEAD"])
}

/// Commit in `repo` a `.gitmodules` naming `(name, path, url)`s and their gitlinks at
/// `commit`s; the commit.
fn commit_submodules(repo: &Path, subs: &[(&str, &str, &str, &str)], message: &str) -> String {
    let mut modules = String::new();
    for (name, path, url, commit) in subs {
        modules.push_str(&format!(
            "[submodule \"{name}\"]\n\tpath = {path}\n\turl = {url}\n"
        ));
        git(
            repo,
            &[
                "update-index",
                "--add",
                "--cacheinfo",
                &format!("160000,{commit},{path}"),
            ],
        );
    }
    std::fs::write(repo.join(".gitmodules"), modules).unwrap();
    git(repo, &["add", ".gitmodules"]);
    git(repo, &["commit", "-q", "-m", message]);
    git(repo, &["rev-parse", "HEAD"])
}

/// Bare copies of `<src>/<name>` served as `<name>.git`.
fn publish(src: &Path, served: &Path, names: &[&str]) {
    for name in names {
        let bare = served.join(format!("{name}.git"));
        let _ = std::fs::remove_dir_all(&bare);
        git(
            served,
            &[
                "clone",
                "-q",
                "--bare",
                "--no-local",
                src.join(name).to_str().unwrap(),
                bare.to_str().unwrap(),
            ],
        );
    }
}

fn on(repo: &str, base_ref: &str, branch: &str) -> CreateSandboxRequest {
    CreateSandboxRequest {
        backend: "local".into(),
        repo: repo.into(),
        base_ref: base_ref.into(),
        branch: branch.into(),
        ..Default::default()
    }
}

async fn sh(core: &Arc<Provisioner>, id: &str, script: &str) -> String {
    let out = core
        .exec(common::exec_req(id, &["sh", "-c", script]))
        .await
        .expect("exec");
    assert_eq!(out.exit_code, 0, "{script}: {out:?}");
    out.stdout
}

/// The commits of the ready templates.
fn templates(state: &Path) -> Vec<String> {
    std::fs::read_dir(state.join("templates"))
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read_to_string(e.path().join("ready")).ok())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remote_is_cloned_once_per_commit_with_its_submodules_checked_out() {
    let src = tempfile::tempdir().unwrap();
    let served = tempfile::tempdir().unwrap();
    let daemon = Daemon::serve(served.path());
    // deep <- lib <- app: `lib` nests `deep`, by relative URLs.
    let deep = plain_repo(src.path(), "deep");
    plain_repo(src.path(), "lib");
    let lib = commit_submodules(
        &src.path().join("lib"),
        &[("deep", "deep", "../deep.git", &deep)],
        "deep",
    );
    plain_repo(src.path(), "app");
    let app = src.path().join("app");
    let head = commit_submodules(&app, &[("lib", "libs/lib", "../lib.git", &lib)], "lib");
    git(&app, &["tag", "-a", "v1", "-m", "v1"]);
    publish(src.path(), served.path(), &["deep", "lib", "app"]);

    let hosts = vec![format!("127.0.0.1:{}", daemon.port)];
    let f = fixture_with(|_, c| {
        c.git_hosts = AllowedHosts::parse(GIT_HOSTS_SETTING, &hosts).unwrap();
    })
    .await;
    let url = daemon.url("app");

    // A wave of four: each asks the remote, one clones (with the submodules), all copy.
    let wave = (1..=4).map(|n| f.core.create(on(&url, "", &format!("fork-{n}"))));
    let made: Vec<_> = futures::future::join_all(wave).await;
    let made: Vec<_> = made.into_iter().map(|r| r.expect("create")).collect();
    assert!(made.iter().all(|s| s.base_commit == head), "{made:?}");
    assert_eq!(templates(&f.state), [head.as_str()]);
    assert_eq!(daemon.asked("app"), 4 + 1, "four ls-remotes and one clone");
    assert_eq!((daemon.asked("lib"), daemon.asked("deep")), (1, 1));

    let id = &made[0].id;
    let seen = sh(&f.core, id, "cat libs/lib/lib.txt libs/lib/deep/deep.txt").await;
    assert_eq!(seen, "lib\ndeep\n");
    // Git in the sandbox sees them as checked out, clean, at their commits.
    let status = sh(&f.core, id, "git submodule status --recursive").await;
    assert!(status.contains(&format!(" {lib} libs/lib")), "{status}");
    assert!(
        status.contains(&format!(" {deep} libs/lib/deep")),
        "{status}"
    );
    assert_eq!(sh(&f.core, id, "git status --porcelain").await, "");
    let config = sh(&f.core, id, "git config --get submodule.lib.url").await;
    assert_eq!(config.trim(), daemon.url("lib"));
    let patch = f
        .core
        .collect_patch(CollectPatchRequest {
            sandbox_id: id.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(patch.patch.is_empty(), "{}", patch.patch);

    // A later create of the same commit: served from the template once the remote and
    // every submodule's repository answered.
    let later = f.core.create(on(&url, "", "fork-5")).await.unwrap();
    assert_eq!(later.base_commit, head);
    assert_eq!(daemon.asked("app"), 6);
    assert_eq!((daemon.asked("lib"), daemon.asked("deep")), (2, 2));
    // What only a clone can resolve is cloned for the fork, its submodules too.
    let cloned = f.core.create(on(&url, "main~0", "fork-c")).await.unwrap();
    assert_eq!(cloned.base_commit, head);
    let seen = sh(&f.core, &cloned.id, "cat libs/lib/deep/deep.txt").await;
    assert_eq!(seen, "deep\n");
    assert_eq!(daemon.asked("app"), 7);
    // A tag names its commit (peeled); the same template.
    let tagged = f.core.create(on(&url, "v1", "fork-6")).await.unwrap();
    assert_eq!(tagged.base_commit, head);
    assert_eq!(templates(&f.state), [head.as_str()]);

    // The branch moves: the next create asks, finds the new commit and builds its
    // template. The old one stays while it was used lately (another run of the tenant
    // may be on it: dropped, it would be cloned again at that run's next create).
    std::fs::write(app.join("new.txt"), "new\n").unwrap();
    git(&app, &["add", "new.txt"]);
    git(&app, &["commit", "-q", "-m", "new"]);
    let newer = git(&app, &["rev-parse", "HEAD"]);
    git(
        &served.path().join("app.git"),
        &["fetch", "-q", app.to_str().unwrap(), "main:main"],
    );
    let moved = f.core.create(on(&url, "main", "fork-7")).await.unwrap();
    assert_eq!(moved.base_commit, newer);
    assert_eq!(
        sh(&f.core, &moved.id, "cat new.txt libs/lib/lib.txt").await,
        "new\nlib\n"
    );
    let mut kept = templates(&f.state);
    kept.sort();
    let mut want = [head.clone(), newer.clone()];
    want.sort();
    assert_eq!(kept, want);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_gitmodules_fail_the_create_naming_the_submodule() {
    let src = tempfile::tempdir().unwrap();
    let served = tempfile::tempdir().unwrap();
    let daemon = Daemon::serve(served.path());
    let lib = plain_repo(src.path(), "lib");
    let main = plain_repo(src.path(), "app");
    let app = src.path().join("app");
    let elsewhere = format!("git://127.0.0.2:{}/lib.git", daemon.port);
    let cases = [
        (
            "local",
            "/etc",
            "a local path or file:// URL is not allowed",
        ),
        (
            "file",
            "file:///srv/lib.git",
            "a local path or file:// URL is not allowed",
        ),
        (
            "climb",
            "../../../../lib.git",
            "climbs above the repository's host",
        ),
        (
            "elsewhere",
            elsewhere.as_str(),
            "is not a git host sandboxes may clone from here",
        ),
    ];
    for (branch, url, _) in &cases {
        git(&app, &["checkout", "-q", "-b", branch, &main]);
        commit_submodules(&app, &[("s", "vendor/s", url, &lib)], branch);
    }
    // Each level's submodule is the repository itself one commit back: five levels.
    git(&app, &["checkout", "-q", "-b", "nest", &main]);
    let mut inner = main.clone();
    for level in 1..=5 {
        inner = commit_submodules(&app, &[("s", "s", "../app.git", &inner)], "nest");
        git(&app, &["branch", &format!("nest-{level}"), &inner]);
    }
    git(&app, &["checkout", "-q", "-b", "missing", &main]);
    commit_submodules(&app, &[("s", "vendor/s", "../nope.git", &lib)], "missing");
    publish(src.path(), served.path(), &["lib", "app"]);

    let hosts = vec![format!("127.0.0.1:{}", daemon.port)];
    let f = fixture_with(|_, c| {
        c.git_hosts = AllowedHosts::parse(GIT_HOSTS_SETTING, &hosts).unwrap();
    })
    .await;
    let url = daemon.url("app");
    for (branch, _, why) in cases {
        match f.core.create(on(&url, branch, "fork-1")).await {
            Err(ProvisionerError::FailedPrecondition(m)) => {
                assert!(m.starts_with("submodule vendor/s: "), "{branch}: {m}");
                assert!(m.contains(why), "{branch}: {m}");
            }
            other => panic!("{branch}: {other:?}"),
        }
    }
    match f.core.create(on(&url, "nest-4", "fork-1")).await {
        Ok(s) => assert_eq!(s.base_commit, git(&app, &["rev-parse", "nest-4"])),
        other => panic!("four levels: {other:?}"),
    }
    match f.core.create(on(&url, "nest-5", "fork-1")).await {
        Err(ProvisionerError::FailedPrecondition(m)) => {
            assert_eq!(m, "submodule s/s/s/s/s: nested deeper than 4 levels");
        }
        other => panic!("five levels: {other:?}"),
    }
    // A submodule whose repository cannot be read: its path, and no more. A wave's
    // creates that waited for the one build get its error (one attempt, not three).
    let wave = (1..=3).map(|n| f.core.create(on(&url, "missing", &format!("fork-{n}"))));
    for e in futures::future::join_all(wave).await {
        let e = e.unwrap_err();
        assert!(matches!(e, ProvisionerError::RepoUnavailable(_)), "{e:?}");
        assert_eq!(
            e.to_string(),
            "repository unavailable: submodule vendor/s cannot be read"
        );
    }
    assert_eq!(daemon.asked("nope"), 1);
    // Nothing half-made is left: only the sandbox of the four levels.
    assert_eq!(f.sandbox_dirs().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_submodule_commit_on_no_branch_is_fetched_by_id_or_named_missing() {
    let src = tempfile::tempdir().unwrap();
    let served = tempfile::tempdir().unwrap();
    let daemon = Daemon::serve(served.path());
    let main = plain_repo(src.path(), "lib");
    let lib = src.path().join("lib");
    // One commit only a pull request's ref names, one the server never got.
    std::fs::write(lib.join("lib.txt"), "reviewed\n").unwrap();
    git(&lib, &["commit", "-q", "-am", "reviewed"]);
    let pulled = git(&lib, &["rev-parse", "HEAD"]);
    std::fs::write(lib.join("lib.txt"), "dropped\n").unwrap();
    git(&lib, &["commit", "-q", "-am", "dropped"]);
    let dropped = git(&lib, &["rev-parse", "HEAD"]);
    git(&lib, &["reset", "-q", "--hard", &main]);
    plain_repo(src.path(), "app");
    let app = src.path().join("app");
    let first = git(&app, &["rev-parse", "HEAD"]);
    commit_submodules(&app, &[("s", "s", "../lib.git", &pulled)], "pulled");
    git(&app, &["checkout", "-q", "-b", "dropped", &first]);
    commit_submodules(&app, &[("s", "s", "../lib.git", &dropped)], "dropped");
    git(&app, &["checkout", "-q", "main"]);
    publish(src.path(), served.path(), &["lib", "app"]);
    let pull = format!("{pulled}:refs/pull/1/head");
    let from = lib.to_str().unwrap();
    git(
        &served.path().join("lib.git"),
        &["fetch", "-q", from, &pull],
    );

    let hosts = vec![format!("127.0.0.1:{}", daemon.port)];
    let f = fixture_with(|_, c| {
        c.git_hosts = AllowedHosts::parse(GIT_HOSTS_SETTING, &hosts).unwrap();
    })
    .await;
    let url = daemon.url("app");
    let made = f.core.create(on(&url, "main", "fork-1")).await.unwrap();
    assert_eq!(sh(&f.core, &made.id, "cat s/lib.txt").await, "reviewed\n");
    match f.core.create(on(&url, "dropped", "fork-2")).await {
        Err(ProvisionerError::FailedPrecondition(m)) => {
            assert_eq!(
                m,
                format!("submodule s: its repository has no commit {dropped}")
            );
        }
        other => panic!("{other:?}"),
    }
}
