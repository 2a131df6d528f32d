//! The `e2b` backend end to end against a local server speaking E2B's REST + envd wire
//! protocol (tests/common/fake_e2b.rs), through the gRPC service with backend "e2b".

mod common;

use common::{fake_e2b, make_repo};
use forkyard_proto::sandbox::v1::{
    CollectPatchRequest, CreateSandboxRequest, DestroySandboxRequest, ExecRequest,
    GetSandboxRequest, HealthCheckRequest, ListSandboxesRequest, ReadFileRequest, Sandbox,
    WriteFileRequest, exec_event::Event, sandbox_provisioner_server::SandboxProvisioner,
};
use forkyard_sandbox_provisioner::{
    Backends, Config, Provisioner, ProvisionerError, SandboxService,
    e2b::{ApiKey, E2bConfig},
};
use std::{
    io::Write,
    sync::{Arc, Mutex},
    time::Duration,
};
use tonic::{Code, Request};

const KEY: &str = "e2b_test_key_5f1d2c9a";

async fn open(tmp: &std::path::Path, server: &str, key: Option<&str>) -> Backends {
    let config = Config::new(tmp.join("state"), "http://127.0.0.1:50052");
    let e2b = E2bConfig {
        api_url: server.into(),
        domain: server.into(),
        api_key: key.map(ApiKey::new),
        request_timeout: Duration::from_secs(2),
        ..E2bConfig::default()
    };
    let core = Provisioner::open(config).await.expect("open provisioner");
    Backends::open(core, e2b).expect("open backends")
}

fn create_req(repo: &std::path::Path) -> CreateSandboxRequest {
    CreateSandboxRequest {
        backend: "e2b".into(),
        repo: repo.to_string_lossy().into_owned(),
        branch: "fork-1".into(),
        labels: [("run".to_owned(), "r1".to_owned())].into(),
        ..Default::default()
    }
}

fn argv(s: &str) -> Vec<String> {
    vec!["sh".into(), "-c".into(), s.into()]
}

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

#[tokio::test]
async fn e2b_sandbox_lifecycle_over_grpc() {
    let logs = Logs::default();
    let sink = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_writer(move || sink.clone())
        .finish();
    tracing::subscriber::set_global_default(subscriber).unwrap();

    let tmp = common::let_through(tempfile::tempdir().unwrap());
    let repo = make_repo(tmp.path());
    let server = fake_e2b::start(KEY).await;
    let svc = SandboxService::with_backends(open(tmp.path(), &server.url, Some(KEY)).await);

    let sbx = assert_created(&svc, &repo).await;
    assert_idempotent_create(&svc, &repo).await;
    assert_exec(&svc, &sbx.id).await;
    assert_exec_stream(&svc, &sbx.id).await;
    assert_exec_timeout(&svc, &sbx.id).await;
    assert_files(&svc, &sbx.id).await;
    assert_health_patch_get_list(&svc, &sbx).await;
    assert_destroyed_once(&svc, &sbx.id).await;

    // the key went to the control plane on every call, and nowhere into the logs
    let seen = server.fake.keys_seen.lock().unwrap().clone();
    assert!(!seen.is_empty() && seen.iter().all(|k| k == KEY));
    let logs = String::from_utf8_lossy(&logs.0.lock().unwrap()).into_owned();
    assert!(logs.contains("e2b sandbox created"), "logs were captured");
    assert!(!logs.contains(KEY), "the API key leaked into the logs");
}

/// A sandbox on the fork branch of the repository, with its labels.
async fn assert_created(svc: &SandboxService, repo: &std::path::Path) -> Sandbox {
    let sbx = svc
        .create_sandbox(Request::new(create_req(repo)))
        .await
        .unwrap()
        .into_inner();
    assert!(sbx.id.starts_with("e2b-"), "{}", sbx.id);
    assert_eq!(sbx.backend, "e2b");
    assert_eq!(sbx.branch, "fork-1");
    assert_eq!(sbx.labels.get("run").map(String::as_str), Some("r1"));
    assert_eq!(sbx.base_commit, common::git(repo, &["rev-parse", "main"]));
    sbx
}

/// The same idempotency key finds the same sandbox (E2B list by metadata).
async fn assert_idempotent_create(svc: &SandboxService, repo: &std::path::Path) {
    let keyed = CreateSandboxRequest {
        idempotency_key: "run-1/fork-2".into(),
        ..create_req(repo)
    };
    let a = svc
        .create_sandbox(Request::new(keyed.clone()))
        .await
        .unwrap()
        .into_inner();
    let b = svc
        .create_sandbox(Request::new(keyed))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(a.id, b.id);
    svc.destroy_sandbox(Request::new(DestroySandboxRequest {
        sandbox_id: a.id.clone(),
        reason: "test".into(),
    }))
    .await
    .unwrap();
}

/// Output and exit code, in the workspace (a clone on the fork branch).
async fn assert_exec(svc: &SandboxService, id: &str) {
    let r = svc
        .exec(Request::new(ExecRequest {
            sandbox_id: id.to_owned(),
            argv: argv("git branch --show-current; cat README.md; echo oops >&2; exit 3"),
            ..Default::default()
        }))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.exit_code, 3);
    assert_eq!(r.stdout, "fork-1\nhello\nworld\n");
    assert_eq!(r.stderr, "oops\n");
    assert!(!r.timed_out);
    let ok = svc
        .exec(Request::new(ExecRequest {
            sandbox_id: id.to_owned(),
            argv: vec!["true".into()],
            ..Default::default()
        }))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(ok.exit_code, 0, "a zero exit code is absent from the JSON");
}

/// A streamed exec: its output as it comes, then its exit.
async fn assert_exec_stream(svc: &SandboxService, id: &str) {
    let mut rx = svc
        .exec_stream(Request::new(ExecRequest {
            sandbox_id: id.to_owned(),
            argv: argv("echo one; sleep 0.2; echo two; exit 4"),
            ..Default::default()
        }))
        .await
        .unwrap()
        .into_inner();
    let mut out = Vec::new();
    let mut exit = None;
    use futures::StreamExt;
    while let Some(ev) = rx.next().await {
        match ev.unwrap().event.unwrap() {
            Event::Stdout(b) => out.extend(b),
            Event::Stderr(_) => {}
            Event::Exit(e) => exit = Some(e),
        }
    }
    assert_eq!(String::from_utf8(out).unwrap(), "one\ntwo\n");
    assert_eq!(exit.unwrap().exit_code, 4);
}

/// A command past its timeout is killed through SendSignal.
async fn assert_exec_timeout(svc: &SandboxService, id: &str) {
    let r = svc
        .exec(Request::new(ExecRequest {
            sandbox_id: id.to_owned(),
            argv: argv("sleep 60"),
            timeout_secs: 1,
            ..Default::default()
        }))
        .await
        .unwrap()
        .into_inner();
    assert!(r.timed_out);
    // Killed at its timeout, not left to the end of its sleep.
    assert!(r.duration_ms < 30_000, "{}", r.duration_ms);
}

/// A file written and read back (binary content too); a path out of the workspace refused.
async fn assert_files(svc: &SandboxService, id: &str) {
    let content = b"line one\n\x00binary\n".to_vec();
    let w = svc
        .write_file(Request::new(WriteFileRequest {
            sandbox_id: id.to_owned(),
            path: "notes/new.txt".into(),
            content: content.clone(),
            mode: 0o644,
        }))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(w.bytes_written, content.len() as u64);
    let rd = svc
        .read_file(Request::new(ReadFileRequest {
            sandbox_id: id.to_owned(),
            path: "notes/new.txt".into(),
            max_bytes: 0,
        }))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(rd.content, content);
    let err = svc
        .read_file(Request::new(ReadFileRequest {
            sandbox_id: id.to_owned(),
            path: "../../etc/passwd".into(),
            max_bytes: 0,
        }))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
}

/// Health, the patch of the file written, get and list.
async fn assert_health_patch_get_list(svc: &SandboxService, sbx: &Sandbox) {
    let h = svc
        .health_check(Request::new(HealthCheckRequest {
            sandbox_id: sbx.id.clone(),
        }))
        .await
        .unwrap()
        .into_inner();
    assert!(h.healthy, "{}", h.detail);
    let p = svc
        .collect_patch(Request::new(CollectPatchRequest {
            sandbox_id: sbx.id.clone(),
            max_bytes: 0,
            ..Default::default()
        }))
        .await
        .unwrap()
        .into_inner();
    assert!(p.patch.contains("notes/new.txt"), "{}", p.patch);
    assert_eq!(p.base_commit, sbx.base_commit);
    assert_eq!(p.diffstat.unwrap().files_changed, 1);
    let got = svc
        .get_sandbox(Request::new(GetSandboxRequest {
            sandbox_id: sbx.id.clone(),
        }))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(got.branch, "fork-1");
    assert_eq!(got.backend, "e2b");
    let listed = svc
        .list_sandboxes(Request::new(ListSandboxesRequest {
            label_selector: [("run".to_owned(), "r1".to_owned())].into(),
        }))
        .await
        .unwrap()
        .into_inner()
        .sandboxes;
    assert_eq!(
        listed.iter().map(|s| s.id.clone()).collect::<Vec<_>>(),
        vec![sbx.id.clone()]
    );
}

/// Destroyed once; then gone, and a second destroy finds nothing.
async fn assert_destroyed_once(svc: &SandboxService, id: &str) {
    let d = svc
        .destroy_sandbox(Request::new(DestroySandboxRequest {
            sandbox_id: id.to_owned(),
            reason: "test".into(),
        }))
        .await
        .unwrap()
        .into_inner();
    assert!(d.existed);
    let err = svc
        .get_sandbox(Request::new(GetSandboxRequest {
            sandbox_id: id.to_owned(),
        }))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    let d = svc
        .destroy_sandbox(Request::new(DestroySandboxRequest {
            sandbox_id: id.to_owned(),
            reason: "again".into(),
        }))
        .await
        .unwrap()
        .into_inner();
    assert!(!d.existed);
}

#[tokio::test]
async fn e2b_errors_auth_is_final_server_errors_and_timeouts_retryable() {
    let tmp = common::let_through(tempfile::tempdir().unwrap());
    let repo = make_repo(tmp.path());
    let server = fake_e2b::start(KEY).await;

    // wrong key: 401 → SandboxAuth (non-retryable), the key never in the message
    let backends = open(tmp.path(), &server.url, Some("wrong_key_123")).await;
    let e2b = backends.by_name("e2b").unwrap().clone();
    let err = e2b.create(create_req(&repo)).await.unwrap_err();
    assert!(matches!(err, ProvisionerError::Auth(_)), "{err:?}");
    assert!(err.to_string().contains("E2B_API_KEY") && !err.to_string().contains("wrong_key_123"));
    let status: tonic::Status = err.into();
    assert_eq!(status.code(), Code::PermissionDenied);
    drop(e2b);

    let tmp2 = common::let_through(tempfile::tempdir().unwrap());
    let backends = open(tmp2.path(), &server.url, Some(KEY)).await;
    let e2b = backends.by_name("e2b").unwrap().clone();
    // 5xx → Unavailable (retryable)
    *server.fake.fail.lock().unwrap() = Some((503, 1));
    let err = e2b.create(create_req(&repo)).await.unwrap_err();
    assert!(matches!(err, ProvisionerError::Unavailable(_)), "{err:?}");
    assert_eq!(tonic::Status::from(err).code(), Code::Unavailable);
    // a slow control plane → timeout → Unavailable (retryable)
    *server.fake.delay.lock().unwrap() = Duration::from_secs(5);
    let err = e2b.list(&Default::default()).await.unwrap_err();
    assert!(
        matches!(err, ProvisionerError::Unavailable(ref m) if m.contains("timed out")),
        "{err:?}"
    );
    *server.fake.delay.lock().unwrap() = Duration::ZERO;
    // a repo that cannot be cloned: final, and the sandbox is killed again
    let mut bad = create_req(&repo);
    bad.repo = "/nonexistent/repo".into();
    let err = e2b.create(bad).await.unwrap_err();
    assert!(
        matches!(err, ProvisionerError::RepoUnavailable(_)),
        "{err:?}"
    );
    assert!(server.fake.sandboxes.lock().unwrap().is_empty());
}

#[tokio::test]
async fn e2b_is_disabled_without_a_key_and_local_is_unchanged() {
    let tmp = common::let_through(tempfile::tempdir().unwrap());
    let repo = make_repo(tmp.path());
    let svc = SandboxService::with_backends(open(tmp.path(), "http://127.0.0.1:9", None).await);
    let err = svc
        .create_sandbox(Request::new(create_req(&repo)))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    assert!(err.message().contains("E2B_API_KEY"), "{}", err.message());
    let mut local = create_req(&repo);
    local.backend = String::new();
    let sbx = svc
        .create_sandbox(Request::new(local))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(sbx.backend, "local");
    assert!(sbx.id.starts_with("sbx-"));
    let listed = svc
        .list_sandboxes(Request::new(ListSandboxesRequest::default()))
        .await
        .unwrap()
        .into_inner()
        .sandboxes;
    assert_eq!(listed.len(), 1);
    let err = svc
        .create_sandbox(Request::new(CreateSandboxRequest {
            backend: "k8s".into(),
            ..create_req(&repo)
        }))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
}

#[tokio::test]
async fn an_image_starts_the_template_built_from_it_and_others_are_refused() {
    let server = fake_e2b::start(KEY).await;
    let tmp = tempfile::tempdir().unwrap();
    let repo = make_repo(&tmp.path().join("repo"));
    let config = Config::new(tmp.path().join("state"), "http://127.0.0.1:50052");
    let e2b = E2bConfig {
        api_url: server.url.clone(),
        domain: server.url.clone(),
        api_key: Some(ApiKey::new(KEY)),
        request_timeout: Duration::from_secs(2),
        templates: forkyard_sandbox_provisioner::e2b::templates::parse(&[
            "python:3.12=py312".into()
        ])
        .unwrap(),
        ..E2bConfig::default()
    };
    let core = Provisioner::open(config).await.expect("open provisioner");
    let svc = SandboxService::with_backends(Backends::open(core, e2b).expect("open backends"));

    let mut req = create_req(&repo);
    req.image = "python:3.12".into();
    let sbx = svc
        .create_sandbox(Request::new(req))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(sbx.image, "python:3.12");
    let sid = sbx.id.trim_start_matches("e2b-").to_owned();
    assert_eq!(
        server
            .fake
            .templates
            .lock()
            .unwrap()
            .get(&sid)
            .map(String::as_str),
        Some("py312")
    );
    let listed = svc
        .get_sandbox(Request::new(GetSandboxRequest {
            sandbox_id: sbx.id.clone(),
        }))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.image, "python:3.12");

    // No image: the default template.
    let plain = svc
        .create_sandbox(Request::new(create_req(&repo)))
        .await
        .unwrap()
        .into_inner();
    let sid = plain.id.trim_start_matches("e2b-").to_owned();
    assert_eq!(
        server
            .fake
            .templates
            .lock()
            .unwrap()
            .get(&sid)
            .map(String::as_str),
        Some("base")
    );

    let before = server.fake.sandboxes.lock().unwrap().len();
    let mut req = create_req(&repo);
    req.image = "node:22".into();
    let err = svc.create_sandbox(Request::new(req)).await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{}", err.message());
    assert!(
        err.message().contains("node:22") && err.message().contains("FORKYARD_E2B_TEMPLATES"),
        "{}",
        err.message()
    );
    let mut req = create_req(&repo);
    req.image = "Not A Reference".into();
    let err = svc.create_sandbox(Request::new(req)).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{}", err.message());
    assert_eq!(
        server.fake.sandboxes.lock().unwrap().len(),
        before,
        "a refused image made a sandbox"
    );
    for s in [sbx.id, plain.id] {
        svc.destroy_sandbox(Request::new(DestroySandboxRequest {
            sandbox_id: s,
            reason: "done".into(),
        }))
        .await
        .unwrap();
    }
}
