//! Test fixtures: a real git repository in a temp dir and a provisioner over a temp
//! state dir, with the real bubblewrap.
#![allow(dead_code)]

// The fake E2B lives in forkyard-common (test-support): the end-to-end tests use it too.
// (Not every test binary that includes this module uses it.)
#[allow(unused_imports)]
pub use forkyard_common::fake_e2b;
pub mod registry;
pub mod test_image;

use forkyard_proto::sandbox::v1::{CreateSandboxRequest, ExecRequest, ExecResponse, Sandbox};
use forkyard_sandbox_provisioner::{Config, Provisioner};
use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    process::Command,
    sync::Arc,
    time::{Duration, Instant},
};

pub struct Fixture {
    pub tmp: tempfile::TempDir,
    pub repo: PathBuf,
    pub state: PathBuf,
    pub core: Arc<Provisioner>,
}

pub fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .output()
        .expect("run git");
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

/// A repository with two commits on `main` and a `feature` branch one commit ahead.
pub fn make_repo(dir: &Path) -> PathBuf {
    let repo = dir.join("repo");
    std::fs::create_dir_all(&repo).unwrap();
    git(&repo, &["init", "-q", "-b", "main"]);
    git(&repo, &["config", "user.name", "Test"]);
    git(&repo, &["config", "user.email", "test@example.com"]);
    std::fs::write(repo.join("README.md"), "hello\n").unwrap();
    std::fs::write(repo.join("old.txt"), "one\ntwo\n").unwrap();
    git(&repo, &["add", "."]);
    git(&repo, &["commit", "-q", "-m", "first"]);
    std::fs::write(repo.join("README.md"), "hello\nworld\n").unwrap();
    git(&repo, &["commit", "-q", "-am", "second"]);
    git(&repo, &["checkout", "-q", "-b", "feature"]);
    std::fs::write(repo.join("feature.txt"), "f\n").unwrap();
    git(&repo, &["add", "."]);
    git(&repo, &["commit", "-q", "-m", "feature"]);
    git(&repo, &["checkout", "-q", "main"]);
    repo
}

/// A temporary directory sandboxes' own uids may pass through (search only), as the
/// state directory's parents must be when the provisioner runs as root.
pub fn let_through(tmp: tempfile::TempDir) -> tempfile::TempDir {
    let_through_dir(tmp.path());
    tmp
}

pub fn let_through_dir(dir: &Path) {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o711)).unwrap();
}

pub async fn open(state: &Path) -> Arc<Provisioner> {
    open_with(state, |_| {}).await
}

/// [`open`] with `configure` applied to the tests' configuration.
pub async fn open_with(state: &Path, configure: impl FnOnce(&mut Config)) -> Arc<Provisioner> {
    let mut config = Config::new(state, "http://127.0.0.1:50052");
    config.exec_timeout = Duration::from_secs(60);
    config.forwarder_path = Some(env!("CARGO_BIN_EXE_sandbox-egress-forwarder").into());
    // The egress tests' servers run on this host's loopback.
    config.egress_private_allowed = vec!["127.0.0.1".parse().unwrap()];
    // So do the image tests' registries (`docker-registry` on a free port): listed, as an
    // operator would list a private registry (any other loopback name is refused).
    config.registry.allowed = forkyard_common::allowed_hosts::AllowedHosts::parse(
        forkyard_sandbox_provisioner::config::REGISTRIES_SETTING,
        &["127.0.0.1".to_owned()],
    )
    .unwrap();
    configure(&mut config);
    Provisioner::open(config).await.expect("open provisioner")
}

pub async fn fixture() -> Fixture {
    fixture_with(|_, _| {}).await
}

/// [`fixture`] with `configure` given the temp dir and the configuration.
pub async fn fixture_with(configure: impl FnOnce(&Path, &mut Config)) -> Fixture {
    let tmp = let_through(tempfile::tempdir().unwrap());
    let repo = make_repo(tmp.path());
    let state = tmp.path().join("state");
    let core = open_with(&state, |c| configure(tmp.path(), c)).await;
    Fixture {
        tmp,
        repo,
        state,
        core,
    }
}

/// Where the host finds what sandbox `id` wrote itself: its overlay workspace's upper
/// layer (`local::storage::overlay`), or its workspace directory.
pub fn own_files(state: &Path, id: &str) -> PathBuf {
    let dir = state.join("sandboxes").join(id);
    match dir.join("upper") {
        upper if upper.is_dir() => upper,
        _ => dir.join("workspace"),
    }
}

impl Fixture {
    /// The sandbox directories on disk.
    pub fn sandbox_dirs(&self) -> Vec<std::ffi::OsString> {
        std::fs::read_dir(self.state.join("sandboxes"))
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect()
    }

    /// A create of a sandbox on the repository, with the isolation of
    /// [`ISOLATION_ENV`] (the suites run again under gVisor: `make test-gvisor`).
    pub fn request(&self, branch: &str) -> CreateSandboxRequest {
        CreateSandboxRequest {
            backend: "local".into(),
            repo: self.repo.display().to_string(),
            branch: branch.into(),
            isolation: isolation(),
            ..Default::default()
        }
    }

    pub async fn create(&self) -> Sandbox {
        self.core
            .create(self.request("forkyard-fork-1"))
            .await
            .expect("create sandbox")
    }

    pub async fn sh(&self, id: &str, script: &str) -> ExecResponse {
        self.core
            .exec(exec_req(id, &["sh", "-c", script]))
            .await
            .expect("exec")
    }
}

/// The variable naming the isolation every fixture's sandbox gets (empty: bubblewrap).
pub const ISOLATION_ENV: &str = "FORKYARD_TEST_ISOLATION";

/// [`ISOLATION_ENV`]'s isolation.
pub fn isolation() -> String {
    std::env::var(ISOLATION_ENV).unwrap_or_default()
}

/// Whether the fixtures' sandboxes run under gVisor ([`ISOLATION_ENV`]).
pub fn under_gvisor() -> bool {
    isolation() == "gvisor"
}

pub fn exec_req(id: &str, argv: &[&str]) -> ExecRequest {
    ExecRequest {
        sandbox_id: id.into(),
        argv: argv.iter().map(|s| (*s).to_owned()).collect(),
        env: HashMap::new(),
        timeout_secs: 0,
        ..Default::default()
    }
}

// Not every test binary that includes this module uses it.
#[allow(unused_imports)]
pub use forkyard_common::testing::host_pids_with;

/// Wait until `cond` holds, up to `limit`.
pub async fn eventually(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if cond() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    cond()
}

/// A `sleep` argument unique to this call, to find the process on the host.
pub fn unique_sleep() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!("{}.{:09}", 300 + std::process::id() % 600, nanos)
}
