//! A run on E2B end to end: the real mesh with its provisioner configured for E2B against
//! the local server speaking E2B's REST and envd protocols (`forkyard_common::fake_e2b`,
//! which runs each sandbox's commands in a temp dir of its own). A run launched with
//! `backend: e2b` has its forks made there (the fake sees the creates, the agents' files
//! are written there), their agents reach the metering LLM gateway at the operator's
//! public URL (no relay reaches an E2B sandbox), patches come back, verify runs, and
//! every sandbox is destroyed; the janitor reaps an E2B orphan by its labels; an unknown
//! backend, and e2b on a mesh whose provisioner has no E2B key, are refused naming the
//! field. That run's repository is private (git's `http-backend` behind basic auth, the
//! mesh holding the token) and it lists egress hosts: the provisioner fetches it on its
//! host and each sandbox gets a bundle, the creates carry E2B network rules denying all
//! but those hosts and the LLM gateway's public address, and the token is in nothing the
//! fake E2B saw, no log, no Temporal history and no result; an egress entry E2B cannot
//! express is refused at launch naming `egress`. A second mesh: a fork's E2B sandbox
//! time charged at the configured E2B price, and a run on E2B cancelled while its agents
//! run.

use forkyard_common::fake_e2b;
use forkyard_proto::{
    budget::v1::budget_ledger_client::BudgetLedgerClient,
    common::v1::{ForkStatus, VerifyStatus},
    gateway::v1::{CancelRunRequest, LaunchRunRequest, Run, RunState},
    janitor::v1::{SweepRequest, janitor_client::JanitorClient},
    labels,
    sandbox::v1::{CreateSandboxRequest, sandbox_provisioner_client::SandboxProvisionerClient},
};
use forkyard_tests::{
    Mesh,
    git_server::{GitHttp, git_env},
    mesh::MeshOptions,
    repo,
    scripted_model::{Script, ScriptedModel},
    support::{Gateway, fork_result, launch, run_account, wait_finished, wait_until},
    token_scan::{assert_absent, assert_not_kept, fresh_token, spellings},
};
use std::{collections::HashMap, path::Path, time::Duration};
use tonic::Code;

const KEY: &str = "e2b_test_key_5f1c";

/// Each fork writes a file, asks its model through the LLM gateway's URL it was given,
/// and keeps the answer and that URL in its workspace.
const AGENT: &str = r#"echo "fork $FORKYARD_FORK ran on e2b" > "fork-$FORKYARD_FORK.txt"
echo "$FORKYARD_LLM_URL" > llm-url.txt
curl -sSf -H "x-api-key: $ANTHROPIC_API_KEY" -H 'anthropic-version: 2023-06-01' -H 'content-type: application/json' -d '{"model":"claude-haiku-4-5","max_tokens":16,"messages":[{"role":"user","content":"hi"}]}' "$ANTHROPIC_BASE_URL/v1/messages" > answer.json"#;

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The provisioner on the fake E2B; the runner's LLM gateway public on `llm_public`.
fn options(e2b_url: &str, model_url: &str, llm_public: u16) -> MeshOptions {
    let on = |service: &str, k: &str, v: &str| (service.to_owned(), k.to_owned(), v.to_owned());
    let public = format!("127.0.0.1:{llm_public}");
    MeshOptions {
        service_env: vec![
            on("sandbox-provisioner", "E2B_API_KEY", KEY),
            on("sandbox-provisioner", "FORKYARD_E2B_API_URL", e2b_url),
            on("sandbox-provisioner", "FORKYARD_E2B_DOMAIN", e2b_url),
            on("agent-runner", "ANTHROPIC_BASE_URL", model_url),
            on("agent-runner", "FORKYARD_LLM_PUBLIC_LISTEN", &public),
            on(
                "agent-runner",
                "FORKYARD_PUBLIC_LLM_GATEWAY_URL",
                &format!("http://{public}"),
            ),
            // What an egress allowlist on E2B always lets through.
            on(
                "sandbox-provisioner",
                "FORKYARD_PUBLIC_LLM_GATEWAY_URL",
                &format!("http://{public}"),
            ),
        ],
        ..Default::default()
    }
}

fn on_e2b(src: &Path, forks: u32) -> LaunchRunRequest {
    LaunchRunRequest {
        backend: "e2b".into(),
        verify_command: "grep -q 'ran on e2b' fork-*.txt".into(),
        ..launch(src, forks, 2, AGENT)
    }
}

/// Refused with `code`, the message naming `field` first.
async fn assert_refused(gw: &mut Gateway, req: LaunchRunRequest, code: Code, field: &str) {
    let e = gw.launch_run(req).await.expect_err("refused");
    assert_eq!(e.code(), code, "{e:?}");
    assert!(
        e.message().starts_with(&format!("{field}: ")),
        "{}",
        e.message()
    );
}

/// Every fork ran on E2B: its result says so, its sandbox was one of the fake's, its
/// patch holds what its agent wrote there (the model's answer through the public URL
/// included), its verify passed.
async fn assert_forks_ran_on_e2b(gw: &mut Gateway, run: &Run, public_url: &str) {
    assert_eq!(run.state, RunState::Completed as i32, "{run:#?}");
    assert_eq!(run.forks_succeeded, 2, "{run:#?}");
    for summary in &run.forks {
        let f = fork_result(gw, &run.run_id, summary.fork).await;
        assert_eq!(f.status, ForkStatus::Succeeded as i32, "{}", f.error);
        assert_eq!(f.backend, "e2b");
        assert!(f.sandbox_id.starts_with("e2b-"), "{}", f.sandbox_id);
        assert!(
            f.patch.contains(&format!("+fork {} ran on e2b", f.fork)),
            "{}",
            f.patch
        );
        assert!(f.patch.contains(&format!("+{public_url}")), "{}", f.patch);
        assert!(f.patch.contains("msg_scripted_"), "{}", f.patch);
        assert_eq!(f.verify, VerifyStatus::Passed as i32, "{f:#?}");
        assert!(
            f.model_cost_micros > 0,
            "the model call was metered: {f:#?}"
        );
    }
}

/// `forkyard status`: each fork's backend in its column.
fn assert_status_shows_e2b(mesh: &Mesh, run_id: &str) {
    let out = std::process::Command::new(forkyard_tests::mesh::bin_dir().join("forkyard"))
        .args(["--gateway", &mesh.endpoint("gateway"), "status", run_id])
        .output()
        .expect("forkyard runs");
    let out = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = out.lines().collect();
    let column = lines[1].find("BACKEND").unwrap_or_else(|| panic!("{out}"));
    for fork in &lines[2..4] {
        assert_eq!(fork.get(column..column + 3), Some("e2b"), "{out}");
    }
}

/// A sandbox on E2B whose run never existed: the janitor lists it through the
/// provisioner (E2B's list, by our metadata) and destroys it there.
async fn assert_the_janitor_reaps_an_e2b_orphan(mesh: &Mesh, src: &Path, fake: &fake_e2b::Fake) {
    let mut prov =
        SandboxProvisionerClient::new(mesh.channel("sandbox-provisioner").await.unwrap());
    let orphan = prov
        .create_sandbox(CreateSandboxRequest {
            backend: "e2b".into(),
            repo: src.to_string_lossy().into_owned(),
            branch: "orphan".into(),
            labels: HashMap::from([
                (labels::RUN_ID.to_owned(), "run-gone".to_owned()),
                (labels::WORKFLOW_ID.to_owned(), "run-gone".to_owned()),
            ]),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(fake.sandboxes.lock().unwrap().len(), 1);
    let mut janitor = JanitorClient::new(mesh.channel("janitor").await.unwrap());
    let report = janitor
        .sweep_now(SweepRequest::default())
        .await
        .unwrap()
        .into_inner();
    let action = report
        .actions
        .iter()
        .find(|a| a.sandbox_id == orphan.id)
        .unwrap_or_else(|| panic!("the orphan was not swept: {report:#?}"));
    assert!(action.destroyed && action.error.is_empty(), "{action:#?}");
    assert_eq!(action.reason, "workflow not found");
    assert!(fake.sandboxes.lock().unwrap().is_empty(), "left on E2B");
}

/// The provisioner restarted without its E2B key offers local alone: a run asking for
/// e2b is refused naming the field (once the gateway's answer of 15 s has aged).
async fn assert_e2b_refused_without_a_key(mesh: &mut Mesh, gw: &mut Gateway, src: &Path) {
    mesh.set_service_env("sandbox-provisioner", "E2B_API_KEY", None);
    mesh.kill9("sandbox-provisioner");
    mesh.start_service("sandbox-provisioner").unwrap();
    mesh.wait_serving("sandbox-provisioner", Duration::from_secs(90))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(16)).await;
    let e = gw.launch_run(on_e2b(src, 1)).await.expect_err("refused");
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(
        e.message().starts_with(
            "backend: e2b is not offered by this mesh's provisioners (they offer: local)"
        ),
        "{}",
        e.message()
    );
}

/// The private repository's server: team tokens as a forge takes them, and the
/// credentials file that gives the mesh this one for every tenant.
fn private_repo(dir: &Path, token: &str) -> (GitHttp, std::path::PathBuf) {
    let src = dir.join("private");
    repo::create(&src).unwrap();
    let http = GitHttp::serve(&src, "forkyard", token);
    let creds = dir.join("git-credentials.toml");
    let text = format!(
        "[[credential]]\nhost = \"127.0.0.1:{}\"\ntenants = [\"*\"]\nusername = \"forkyard\"\ntoken = \"{token}\"\n",
        http.port
    );
    std::fs::write(&creds, text).unwrap();
    (http, creds)
}

/// The run's forks on E2B each had the allowlist's network rules: all denied but pypi
/// and the LLM gateway's public address; and the token is nowhere the fake saw.
fn assert_e2b_saw_rules_not_the_token(fake: &fake_e2b::Fake, llm_public: u16, secrets: &[String]) {
    let networks = fake.networks.lock().unwrap().clone();
    assert_eq!(
        networks.len(),
        2,
        "both creates carried rules: {networks:?}"
    );
    for n in networks.values() {
        assert_eq!(
            *n,
            serde_json::json!({"denyOut": ["0.0.0.0/0"], "allowOut": ["pypi.org", format!("127.0.0.1:{llm_public}")]})
        );
    }
    for s in secrets {
        assert_eq!(fake.where_seen(s), Vec::<String>::new());
    }
    assert!(!fake.commands.lock().unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_on_e2b_end_to_end() {
    let e2b = fake_e2b::start(KEY).await;
    let model = ScriptedModel::start(Script::edit("true")).await;
    let llm_public = free_port();
    let served = tempfile::tempdir().unwrap();
    let token = fresh_token();
    let (http, creds) = private_repo(served.path(), &token);
    let mut opts = options(&e2b.url, &model.url, llm_public);
    opts.service_env
        .extend(git_env(&format!("127.0.0.1:{}", http.port), &creds));
    let mut mesh = Mesh::start_with(opts).await.expect("mesh");
    let src = mesh.state_dir().join("repo");
    repo::create(&src).unwrap();
    let mut gw = Gateway::new(mesh.channel("gateway").await.unwrap());

    assert_refused(
        &mut gw,
        LaunchRunRequest {
            backend: "modal".into(),
            ..on_e2b(&src, 1)
        },
        Code::InvalidArgument,
        "backend",
    )
    .await;
    let private = |egress: &str| LaunchRunRequest {
        repo: http.url(),
        egress: vec![egress.into()],
        ..on_e2b(&src, 2)
    };
    // Public IPv6 is within the tenant's policy, not within E2B's rules.
    let v6 = private("[2606:4700::1111]:443");
    assert_refused(&mut gw, v6, Code::InvalidArgument, "egress").await;
    let run_id = gw
        .launch_run(private("pypi.org"))
        .await
        .expect("launch on e2b")
        .into_inner()
        .run_id;
    let run = wait_finished(&mut gw, &run_id, Duration::from_secs(180)).await;
    assert_eq!(run.spec.as_ref().unwrap().backend, "e2b");
    let public_url = format!("http://127.0.0.1:{llm_public}");
    assert_forks_ran_on_e2b(&mut gw, &run, &public_url).await;
    let secrets = spellings("forkyard", &token);
    for f in &run.forks {
        let r = fork_result(&mut gw, &run_id, f.fork).await;
        assert_absent("a fork's result", &format!("{r:?}"), &secrets);
    }
    assert_absent("the run", &format!("{run:?}"), &secrets);
    assert_not_kept(&mesh, &run_id, 2, &http.url(), &secrets);
    assert_e2b_saw_rules_not_the_token(&e2b.fake, llm_public, &secrets);
    assert_status_shows_e2b(&mesh, &run_id);
    assert_eq!(
        e2b.fake.templates.lock().unwrap().len(),
        2,
        "two creates on E2B"
    );
    assert!(
        e2b.fake.sandboxes.lock().unwrap().is_empty(),
        "every sandbox destroyed"
    );
    assert_eq!(model.model_calls().len(), 2);
    assert!(
        e2b.fake.keys_seen.lock().unwrap().iter().all(|k| k == KEY),
        "the control plane saw only the key"
    );
    assert_the_janitor_reaps_an_e2b_orphan(&mesh, &src, &e2b.fake).await;
    assert_e2b_refused_without_a_key(&mut mesh, &mut gw, &src).await;
}

/// A fork on E2B that only sleeps: its sandbox's life charged at the configured E2B
/// price ($0.01 a second here: 10,000 micro-USD), committed with the fork and held by the
/// run's ledger account.
async fn assert_e2b_sandbox_time_is_charged(mesh: &Mesh, gw: &mut Gateway, src: &Path) {
    let req = LaunchRunRequest {
        backend: "e2b".into(),
        ..launch(src, 1, 1, "sleep 3; echo slept > slept.txt")
    };
    let run_id = gw.launch_run(req).await.unwrap().into_inner().run_id;
    let run = wait_finished(gw, &run_id, Duration::from_secs(120)).await;
    assert_eq!(run.state, RunState::Completed as i32, "{run:#?}");
    let f = fork_result(gw, &run_id, 1).await;
    assert_eq!(f.status, ForkStatus::Succeeded as i32, "{f:#?}");
    assert_eq!(f.backend, "e2b");
    // At least the agent's 3 s; at most the fork's whole life (its sandbox lives inside it).
    let life_ms = f.finished_unix_ms - f.started_unix_ms;
    assert!(
        f.sandbox_cost_micros >= 30_000 && f.sandbox_cost_micros <= life_ms * 10 + 10_000,
        "sandbox cost {} for a fork of {life_ms} ms: {f:#?}",
        f.sandbox_cost_micros
    );
    assert_eq!(f.model_cost_micros, 0, "the command reported no model use");
    assert_eq!(f.cost_micros, f.sandbox_cost_micros);
    let mut ledger = BudgetLedgerClient::new(mesh.channel("budget-ledger").await.unwrap());
    let account = run_account(&mut ledger, &run_id).await;
    assert_eq!(account.spent_micros, f.cost_micros, "the ledger holds it");
    assert_eq!(account.reserved_micros, 0);
}

/// A run on E2B cancelled while its agents run: its forks say cancelled and E2B holds
/// none of their sandboxes.
async fn assert_a_cancelled_e2b_run_leaves_nothing(
    gw: &mut Gateway,
    src: &Path,
    fake: &fake_e2b::Fake,
) {
    let req = LaunchRunRequest {
        backend: "e2b".into(),
        ..launch(src, 2, 2, "sleep 120")
    };
    let run_id = gw.launch_run(req).await.unwrap().into_inner().run_id;
    wait_until(gw, &run_id, Duration::from_secs(90), |r| {
        r.forks.iter().all(|f| f.phase == "running agent")
    })
    .await;
    assert_eq!(fake.sandboxes.lock().unwrap().len(), 2, "both forks on E2B");
    gw.cancel_run(CancelRunRequest {
        run_id: run_id.clone(),
        ..Default::default()
    })
    .await
    .expect("cancel");
    let run = wait_finished(gw, &run_id, Duration::from_secs(60)).await;
    assert_eq!(run.state, RunState::Cancelled as i32, "{run:#?}");
    for f in &run.forks {
        assert_eq!(f.status, ForkStatus::Cancelled as i32, "{f:#?}");
    }
    assert!(
        fake.sandboxes.lock().unwrap().is_empty(),
        "left on E2B: {:?}",
        fake.sandboxes.lock().unwrap().keys().collect::<Vec<_>>()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_on_e2b_is_charged_its_sandbox_time_and_can_be_cancelled() {
    let e2b = fake_e2b::start(KEY).await;
    let model = ScriptedModel::start(Script::edit("true")).await;
    let mut opts = options(&e2b.url, &model.url, free_port());
    opts.service_env.push((
        "sandbox-provisioner".into(),
        "FORKYARD_E2B_SECOND_USD".into(),
        "0.01".into(),
    ));
    let mesh = Mesh::start_with(opts).await.expect("mesh");
    let src = mesh.state_dir().join("repo");
    repo::create(&src).unwrap();
    let mut gw = Gateway::new(mesh.channel("gateway").await.unwrap());
    assert_e2b_sandbox_time_is_charged(&mesh, &mut gw, &src).await;
    assert_a_cancelled_e2b_run_leaves_nothing(&mut gw, &src, &e2b.fake).await;
}
