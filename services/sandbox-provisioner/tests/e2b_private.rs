//! A private repository and an egress allowlist on the e2b backend, against the local
//! server speaking E2B's wire protocol (`forkyard_common::fake_e2b`) and a real git
//! server (`git http-backend`) that answers only the tenant's token: the repository is
//! fetched once on the provisioner's host for a run's sandboxes and each is given it as
//! a bundle, at the right commit and branch, with a patch to collect; the token is in
//! nothing the fake saw (commands, their environment, files, the sandboxes' filesystems,
//! metadata, network rules) nor in the provisioner's logs; the create carries the network
//! rules the allowlist implies; what cannot be done is refused before any sandbox.

mod common;
#[path = "common/git_http.rs"]
mod git_http;

use common::{fake_e2b, git, make_repo};
use forkyard_common::{allowed_hosts::AllowedHosts, git_credentials::GitCredentials};
use forkyard_proto::sandbox::v1::{
    CollectPatchRequest, CreateSandboxRequest, DestroySandboxRequest, Sandbox, WriteFileRequest,
    sandbox_provisioner_server::SandboxProvisioner,
};
use forkyard_sandbox_provisioner::{
    Backends, Config, Provisioner, SandboxService,
    config::GIT_HOSTS_SETTING,
    e2b::{ApiKey, E2bConfig},
};
use git_http::GitHttp;
use std::{
    io::Write,
    path::Path,
    sync::{Arc, Mutex},
    time::Duration,
};
use tonic::{Code, Request};

const KEY: &str = "e2b_test_key_private_7c1e";
const TOKEN: &str = "ghs_e2bPrivateRepoToken0d9f3a";
const LLM: &str = "llm.forkyard.example:443";

#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>);
impl Write for Logs {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The provisioner with its E2B backend on `e2b`, tenant `team-a` holding `TOKEN` for
/// the git server on `port` (listed as a git host), its LLM gateway at `LLM`.
async fn service(tmp: &Path, e2b: &str, port: u16, bundle_max: u64) -> SandboxService {
    let creds = tmp.join("credentials.toml");
    std::fs::write(
        &creds,
        format!(
            "[[credential]]\nhost = \"127.0.0.1:{port}\"\ntenants = [\"team-a\"]\nusername = \"x-access-token\"\ntoken = \"{TOKEN}\"\n"
        ),
    )
    .unwrap();
    let mut config = Config::new(tmp.join("state"), "http://127.0.0.1:50052");
    config.git_hosts =
        AllowedHosts::parse(GIT_HOSTS_SETTING, &[format!("127.0.0.1:{port}")]).unwrap();
    config.git_credentials = Arc::new(GitCredentials::open(Some(creds), None).unwrap());
    let e2b = E2bConfig {
        api_url: e2b.into(),
        domain: e2b.into(),
        api_key: Some(ApiKey::new(KEY)),
        request_timeout: Duration::from_secs(10),
        allow_out: vec![LLM.into()],
        bundle_max_bytes: bundle_max,
        ..E2bConfig::default()
    };
    let core = Provisioner::open(config).await.expect("open provisioner");
    SandboxService::with_backends(Backends::open(core, e2b).expect("backends"))
}

fn on_e2b(repo: &str, tenant: &str, branch: &str) -> CreateSandboxRequest {
    CreateSandboxRequest {
        backend: "e2b".into(),
        repo: repo.into(),
        tenant: tenant.into(),
        branch: branch.into(),
        egress_allow: vec!["pypi.org".into(), "*.npmjs.org:443".into()],
        ..Default::default()
    }
}

/// A bare copy of `src` served as `r`.
fn publish(src: &Path, served: &Path) {
    let out = std::process::Command::new("git")
        .args(["clone", "-q", "--bare"])
        .arg(src)
        .arg(served.join("r.git"))
        .status()
        .unwrap();
    assert!(out.success());
}

/// The workspace of E2B sandbox `s` as the fake holds it.
fn workspace(fake: &fake_e2b::Fake, s: &Sandbox) -> std::path::PathBuf {
    let id = s.id.strip_prefix("e2b-").unwrap();
    fake.root.join(id).join("home/user/workspace")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_private_repository_reaches_e2b_as_a_bundle_and_its_token_never_does() {
    let logs = Logs::default();
    let sink = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_writer(move || sink.clone())
        .finish();
    tracing::subscriber::set_global_default(subscriber).unwrap();

    let tmp = common::let_through(tempfile::tempdir().unwrap());
    let src = make_repo(tmp.path());
    let head = git(&src, &["rev-parse", "HEAD"]).trim().to_owned();
    let served = tempfile::tempdir().unwrap();
    publish(&src, served.path());
    let http = GitHttp::serve(served.path().to_owned(), "x-access-token", TOKEN).await;
    let e2b = fake_e2b::start(KEY).await;
    let svc = service(tmp.path(), &e2b.url, http.port, 64 << 20).await;
    let url = http.url("r");

    // Two forks of a run: the remote is asked by each, fetched once. The second has no
    // allowlist: it is denied everything but the LLM gateway, as a local sandbox is.
    let mut made = Vec::new();
    for n in 1..=2 {
        let mut req = on_e2b(&url, "team-a", &format!("fork-{n}"));
        if n == 2 {
            req.egress_allow.clear();
        }
        made.push(
            svc.create_sandbox(Request::new(req))
                .await
                .expect("create")
                .into_inner(),
        );
    }
    assert_eq!(
        http.fetches(),
        1,
        "one fetch on the host for both sandboxes"
    );
    for (n, s) in made.iter().enumerate() {
        assert_eq!(s.base_commit, head);
        let ws = workspace(&e2b.fake, s);
        assert_eq!(git(&ws, &["rev-parse", "HEAD"]).trim(), head);
        assert_eq!(
            git(&ws, &["branch", "--show-current"]).trim(),
            format!("fork-{}", n + 1)
        );
        assert_eq!(git(&ws, &["remote", "get-url", "origin"]).trim(), url);
        assert_eq!(
            std::fs::read_to_string(ws.join("README.md")).unwrap(),
            "hello\nworld\n"
        );
        assert!(
            !ws.parent().unwrap().join(".forkyard-repo.bundle").exists(),
            "bundle removed"
        );
        let id = s.id.strip_prefix("e2b-").unwrap();
        let allowed = if n == 0 {
            serde_json::json!(["pypi.org", "*.npmjs.org:443", LLM])
        } else {
            serde_json::json!([LLM])
        };
        assert_eq!(
            e2b.fake.networks.lock().unwrap()[id],
            serde_json::json!({"denyOut": ["0.0.0.0/0"], "allowOut": allowed}),
        );
    }
    assert_patch_collected(&svc, &made[0], &head).await;

    let basic = {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD.encode(format!("x-access-token:{TOKEN}"))
    };
    for secret in [TOKEN, basic.as_str()] {
        assert_eq!(
            e2b.fake.where_seen(secret),
            Vec::<String>::new(),
            "{secret}"
        );
        let logged = String::from_utf8_lossy(&logs.0.lock().unwrap()).into_owned();
        assert!(!logged.contains(secret), "the token was logged");
    }
    assert!(
        !e2b.fake.commands.lock().unwrap().is_empty(),
        "the fake saw the commands"
    );
    for s in made {
        let req = DestroySandboxRequest {
            sandbox_id: s.id,
            reason: "test".into(),
        };
        svc.destroy_sandbox(Request::new(req)).await.unwrap();
    }
}

/// A file changed in the sandbox comes back in the patch, against the base commit.
async fn assert_patch_collected(svc: &SandboxService, s: &Sandbox, head: &str) {
    svc.write_file(Request::new(WriteFileRequest {
        sandbox_id: s.id.clone(),
        path: "README.md".into(),
        content: b"hello from e2b\n".to_vec(),
        ..Default::default()
    }))
    .await
    .unwrap();
    let p = svc
        .collect_patch(Request::new(CollectPatchRequest {
            sandbox_id: s.id.clone(),
            ..Default::default()
        }))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(p.base_commit, head);
    assert!(p.patch.contains("+hello from e2b"), "{}", p.patch);
    assert_eq!(p.diffstat.unwrap().files_changed, 1);
}

/// Refused before any sandbox is made: a tenant without the token, an entry E2B cannot
/// express, a repository with submodules, a bundle past the bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_e2b_cannot_be_given_is_refused_before_a_sandbox() {
    let tmp = common::let_through(tempfile::tempdir().unwrap());
    let src = make_repo(tmp.path());
    let served = tempfile::tempdir().unwrap();
    publish(&src, served.path());
    let http = GitHttp::serve(served.path().to_owned(), "x-access-token", TOKEN).await;
    let e2b = fake_e2b::start(KEY).await;
    let svc = service(tmp.path(), &e2b.url, http.port, 64 << 20).await;
    let code = |r: Result<tonic::Response<Sandbox>, tonic::Status>| {
        let e = r.expect_err("refused");
        (e.code(), e.message().to_owned())
    };

    let (c, m) = code(
        svc.create_sandbox(Request::new(on_e2b(&http.url("r"), "team-b", "f")))
            .await,
    );
    assert_eq!(c, Code::FailedPrecondition, "{m}");
    assert!(m.contains("cannot be read"), "{m}");

    for bad in ["10.0.0.7", "[2606:4700::1111]:443", "localhost"] {
        let req = CreateSandboxRequest {
            egress_allow: vec![bad.into()],
            ..on_e2b(&http.url("r"), "team-a", "f")
        };
        let (c, m) = code(svc.create_sandbox(Request::new(req)).await);
        assert_eq!(c, Code::InvalidArgument, "{bad}: {m}");
        assert!(m.contains("egress_allow"), "{m}");
    }

    std::fs::write(
        src.join(".gitmodules"),
        "[submodule \"x\"]\n\tpath = x\n\turl = ../x.git\n",
    )
    .unwrap();
    git(&src, &["add", ".gitmodules"]);
    git(&src, &["commit", "-q", "-m", "submodules"]);
    let local = src.to_string_lossy().into_owned();
    let (c, m) = code(
        svc.create_sandbox(Request::new(on_e2b(&local, "", "f")))
            .await,
    );
    assert_eq!(c, Code::InvalidArgument, "{m}");
    assert!(m.contains("repo") && m.contains("submodules"), "{m}");
    assert!(
        e2b.fake.sandboxes.lock().unwrap().is_empty(),
        "no sandbox was made"
    );
    assert!(
        e2b.fake.templates.lock().unwrap().is_empty(),
        "no create reached E2B"
    );

    std::fs::create_dir_all(tmp.path().join("small")).unwrap();
    let small = service(&tmp.path().join("small"), &e2b.url, http.port, 100).await;
    let (c, m) = code(
        small
            .create_sandbox(Request::new(on_e2b(&http.url("r"), "team-a", "f")))
            .await,
    );
    assert_eq!(c, Code::FailedPrecondition, "{m}");
    assert!(m.contains("--e2b-bundle-max-bytes"), "{m}");
    assert!(
        e2b.fake.templates.lock().unwrap().is_empty(),
        "no create reached E2B"
    );
}
