//! Test fixtures: a real provisioner (bubblewrap) and a real ledger (SQLite) served over
//! gRPC in-process, and a local HTTP server speaking the Anthropic Messages and OpenAI
//! chat-completions protocols from a script, recording every request.
#![allow(dead_code)]

pub mod llm_agent;

use axum::{
    Json, Router,
    extract::State,
    http::{HeaderMap, StatusCode},
    response::{IntoResponse, Response},
    routing::post,
};
use forkyard_agent_runner::{
    drivers::Drivers,
    llm::{Endpoint, Secret, http::RetryPolicy},
    models::Models,
    progress::ProgressSink,
    provisioners::Provisioners,
    runner::{Runner, short_call_channel},
    transcript::ArtifactStore,
};
use forkyard_budget_ledger::{LedgerService, LedgerStore};
use forkyard_proto::{
    agent::v1::AgentProgress,
    budget::v1::{OpenAccountRequest, ReserveRequest, budget_ledger_client::BudgetLedgerClient},
    sandbox::v1::{CreateSandboxRequest, sandbox_provisioner_client::SandboxProvisionerClient},
};
use forkyard_sandbox_provisioner::{Config, Provisioner, SandboxService};
use serde_json::Value;
use std::{
    collections::VecDeque,
    path::{Path, PathBuf},
    process::Command,
    sync::{Arc, Mutex},
    time::Duration,
};
use tonic::{service::Routes, transport::Channel};

pub const KEY: &str = "sk-ant-test-SECRET-4242";
pub const OPENAI_KEY: &str = "sk-openai-test-SECRET-9191";

/// What the fake model server answers next, and what it was asked.
#[derive(Default)]
pub struct Script {
    pub replies: VecDeque<(u16, Value)>,
    pub requests: Vec<(HeaderMap, Value)>,
    /// Hold every reply this long (to cancel a call in flight).
    pub delay: Duration,
}

pub type Shared = Arc<Mutex<Script>>;

async fn reply(State(s): State<Shared>, headers: HeaderMap, Json(body): Json<Value>) -> Response {
    let (next, delay) = {
        let mut s = s.lock().unwrap();
        s.requests.push((headers, body));
        (s.replies.pop_front(), s.delay)
    };
    tokio::time::sleep(delay).await;
    match next {
        Some((status, body)) => {
            let mut r = (StatusCode::from_u16(status).unwrap(), Json(body)).into_response();
            if status == 429 {
                r.headers_mut().insert("retry-after", "0".parse().unwrap());
            }
            r
        }
        None => (StatusCode::INTERNAL_SERVER_ERROR, "script exhausted").into_response(),
    }
}

/// The fake model API; its base URL.
pub async fn model_server(script: Shared) -> String {
    let app = Router::new()
        .route("/v1/messages", post(reply))
        .route("/v1/chat/completions", post(reply))
        .with_state(script);
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(l, app).await.unwrap() });
    format!("http://{addr}")
}

pub fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

pub struct Fixture {
    pub tmp: tempfile::TempDir,
    pub runner: Runner,
    pub sandbox_id: String,
    pub provisioner: SandboxProvisionerClient<Channel>,
    pub ledger: BudgetLedgerClient<Channel>,
    pub core: Arc<Provisioner>,
    pub artifacts: PathBuf,
}

async fn serve(routes: Routes) -> String {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(forkyard_common::server::serve(
        l,
        routes,
        std::future::pending(),
    ));
    format!("http://{addr}")
}

pub async fn fixture(base_url: &str) -> Fixture {
    let tmp = tempfile::tempdir().unwrap();
    // Run as root, the provisioner runs each sandbox as a uid of its own, whose
    // bubblewrap must pass through here to the workspace (search only).
    std::fs::set_permissions(
        tmp.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o711),
    )
    .unwrap();
    let repo = tmp.path().join("repo");
    std::fs::create_dir_all(&repo).unwrap();
    git(&repo, &["init", "-q", "-b", "main"]);
    git(&repo, &["config", "user.name", "Test"]);
    git(&repo, &["config", "user.email", "test@example.com"]);
    std::fs::write(repo.join("README.md"), "hello world\n").unwrap();
    git(&repo, &["add", "."]);
    git(&repo, &["commit", "-q", "-m", "first"]);

    let mut config = Config::new(tmp.path().join("prov"), "http://127.0.0.1:50052");
    config.exec_timeout = Duration::from_secs(120);
    // Sandbox time is free here: the ledger figures are the model's alone.
    config.prices = forkyard_sandbox_provisioner::usage::Prices {
        cpu_second_usd: 0.0,
        gib_second_usd: 0.0,
        e2b_second_usd: 0.0,
    };
    let core = Provisioner::open(config).await.expect("open provisioner");
    let prov_url = serve(Routes::new(SandboxService::new(core.clone()).into_server())).await;

    let store = LedgerStore::connect(&format!(
        "sqlite://{}",
        tmp.path().join("ledger.db").display()
    ))
    .await
    .unwrap();
    let ledger_url = serve(Routes::new(
        LedgerService::new(Arc::new(store)).into_server(),
    ))
    .await;

    let mut provisioner = SandboxProvisionerClient::connect(prov_url.clone())
        .await
        .unwrap();
    let sbx = provisioner
        .create_sandbox(CreateSandboxRequest {
            backend: "local".into(),
            repo: repo.display().to_string(),
            branch: "forkyard-fork-1".into(),
            ..Default::default()
        })
        .await
        .expect("create sandbox")
        .into_inner();

    let retry = RetryPolicy {
        attempts: 3,
        initial: Duration::from_millis(20),
        max_delay: Duration::from_millis(100),
    };
    let drivers = Drivers::new(
        Models::default(),
        Endpoint {
            base_url: base_url.to_owned(),
            key: Secret::new(KEY.into()),
            retry,
        },
        Endpoint {
            base_url: format!("{base_url}/v1"),
            key: Secret::new(OPENAI_KEY.into()),
            retry,
        },
    );
    let artifacts = tmp.path().join("artifacts");
    let runner = Runner {
        llm_gateway: None,
        provisioners: Provisioners::new(prov_url),
        ledger: short_call_channel("ledger", &ledger_url).unwrap(),
        drivers: Arc::new(drivers),
        store: Some(ArtifactStore::new(&artifacts)),
        heartbeat: Duration::from_millis(200),
        advertise: "http://runner-under-test:50053".into(),
        loops: Default::default(),
    };
    Fixture {
        tmp,
        runner,
        sandbox_id: sbx.id,
        provisioner,
        ledger: BudgetLedgerClient::connect(ledger_url).await.unwrap(),
        core,
        artifacts,
    }
}

impl Fixture {
    /// A run account with `budget` and a reservation of `reserve` for fork 1.
    pub async fn reservation(&mut self, run_id: &str, budget: i64, reserve: i64) -> String {
        self.ledger
            .open_account(OpenAccountRequest {
                account_id: run_id.into(),
                budget_micros: budget,
                idempotency_key: format!("{run_id}/open"),
            })
            .await
            .unwrap();
        self.ledger
            .reserve(ReserveRequest {
                account_id: run_id.into(),
                amount_micros: reserve,
                holder: format!("{run_id}/fork-1"),
                idempotency_key: format!("{run_id}/reserve"),
            })
            .await
            .unwrap()
            .into_inner()
            .reservation_id
    }

    pub async fn charged(&mut self, run_id: &str) -> i64 {
        spent(&mut self.ledger, run_id).await
    }
}

/// What the run's ledger account has spent (charges and commits).
pub async fn spent(ledger: &mut BudgetLedgerClient<Channel>, run_id: &str) -> i64 {
    ledger
        .get_account(forkyard_proto::budget::v1::GetAccountRequest {
            account_id: run_id.into(),
        })
        .await
        .unwrap()
        .into_inner()
        .spent_micros
}

/// Heartbeats, kept.
#[derive(Default, Clone)]
pub struct Beats(pub Arc<Mutex<Vec<AgentProgress>>>);

impl ProgressSink for Beats {
    async fn report(&self, p: AgentProgress) {
        self.0.lock().unwrap().push(p);
    }
}

impl Beats {
    pub fn last(&self) -> AgentProgress {
        self.0.lock().unwrap().last().cloned().unwrap_or_default()
    }
    pub fn all_json(&self) -> String {
        serde_json::to_string(&*self.0.lock().unwrap()).unwrap()
    }
}

/// Log output captured for the secret checks.
#[derive(Clone, Default)]
pub struct LogBuf(pub Arc<Mutex<Vec<u8>>>);

impl std::io::Write for LogBuf {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Anthropic usage of `input`/`output` tokens.
pub fn a_usage(input: u64, output: u64) -> Value {
    serde_json::json!({"input_tokens": input, "output_tokens": output,
        "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0})
}

// Not every test binary that includes this module uses it.
#[allow(unused_imports)]
pub use forkyard_common::testing::host_pids_with;
