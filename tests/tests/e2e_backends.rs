//! One run over several backends, through the real mesh: the local backend and E2B (the
//! local server speaking E2B's REST and envd protocols, `forkyard_common::fake_e2b`).
//!
//! - Overflow, the issue's run: 10 forks, all allowed at once, over `local` (share 4)
//!   then `e2b`: forks 1 to 4 run locally, 5 to 10 on E2B, every fork's result and
//!   `forkyard status` say where, the provisioner never holds more than 4 of the run's
//!   local sandboxes, one ledger account holds the whole run's spend to the micro-dollar
//!   (the sum of the forks' costs, nothing left reserved), every sandbox is gone at the
//!   end on both backends.
//! - Failover: E2B refusing every create (503) while local has room: the forks placed on
//!   e2b land on local and the run completes.
//! - Waiting for room: E2B refusing every create while local's share (1) is taken by a
//!   long fork: the refused forks wait, pending and holding no reservation, and run on
//!   local one after the other once it has room (they used to fail after their wave's
//!   retry rounds however long the fork ahead ran).
//! - Bad input, refused naming the entry's field; and `isolation: gvisor` on a mesh whose
//!   provisioner cannot run runsc, refused at launch with the reason.

use forkyard_common::fake_e2b;
use forkyard_proto::{
    budget::v1::budget_ledger_client::BudgetLedgerClient,
    common::v1::ForkStatus,
    gateway::v1::{BackendShare, LaunchRunRequest, Run, RunState},
    labels,
    sandbox::v1::{ListSandboxesRequest, sandbox_provisioner_client::SandboxProvisionerClient},
};
use forkyard_tests::{
    Mesh,
    mesh::MeshOptions,
    repo,
    scripted_model::{Script, ScriptedModel},
    support::{
        Gateway, fork_result, launch, run_account, wait_finished, wait_until, workspaces_left,
    },
};
use std::{
    collections::HashMap,
    path::Path,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::Duration,
};
use tonic::Code;

const KEY: &str = "e2b_test_key_9a2d";

/// Long enough that every fork of a wave is in flight at once.
const AGENT: &str = r#"sleep 2; echo "fork $FORKYARD_FORK" > "fork-$FORKYARD_FORK.txt""#;

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The provisioner on the fake E2B and without runsc; the runner's LLM gateway public.
fn options(e2b_url: &str, model_url: &str) -> MeshOptions {
    let on = |service: &str, k: &str, v: &str| (service.to_owned(), k.to_owned(), v.to_owned());
    let public = format!("127.0.0.1:{}", free_port());
    MeshOptions {
        service_env: vec![
            on("sandbox-provisioner", "E2B_API_KEY", KEY),
            on("sandbox-provisioner", "FORKYARD_E2B_API_URL", e2b_url),
            on("sandbox-provisioner", "FORKYARD_E2B_DOMAIN", e2b_url),
            on(
                "sandbox-provisioner",
                "FORKYARD_RUNSC_PATH",
                "/nonexistent/runsc",
            ),
            on("agent-runner", "ANTHROPIC_BASE_URL", model_url),
            on("agent-runner", "FORKYARD_LLM_PUBLIC_LISTEN", &public),
            on(
                "agent-runner",
                "FORKYARD_PUBLIC_LLM_GATEWAY_URL",
                &format!("http://{public}"),
            ),
        ],
        ..Default::default()
    }
}

fn share(name: &str, max_concurrent: u32) -> BackendShare {
    BackendShare {
        name: name.into(),
        max_concurrent,
    }
}

fn over(src: &Path, forks: u32, backends: Vec<BackendShare>) -> LaunchRunRequest {
    LaunchRunRequest {
        backends,
        ..launch(src, forks, forks, AGENT)
    }
}

/// Each fork's backend, by fork number, from its full result; every fork succeeded on a
/// sandbox of that backend.
async fn backends_of(gw: &mut Gateway, run: &Run) -> Vec<String> {
    assert_eq!(run.state, RunState::Completed as i32, "{run:#?}");
    let mut out = Vec::new();
    for summary in &run.forks {
        let f = fork_result(gw, &run.run_id, summary.fork).await;
        assert_eq!(f.status, ForkStatus::Succeeded as i32, "{f:#?}");
        let prefix = if f.backend == "e2b" { "e2b-" } else { "sbx-" };
        assert!(f.sandbox_id.starts_with(prefix), "{f:#?}");
        assert!(
            f.patch.contains(&format!("+fork {}", f.fork)),
            "{}",
            f.patch
        );
        out.push(f.backend);
    }
    out
}

/// The most of the run's local sandboxes the provisioner held at once, sampled every
/// 50 ms until `stop`.
fn sample_local(mesh: &Mesh, run_id: &str, stop: Arc<AtomicBool>) -> Arc<AtomicUsize> {
    let most = Arc::new(AtomicUsize::new(0));
    let (seen, endpoint, run_id) = (
        most.clone(),
        mesh.endpoint("sandbox-provisioner"),
        run_id.to_owned(),
    );
    tokio::spawn(async move {
        let mut prov = SandboxProvisionerClient::connect(endpoint).await.unwrap();
        let selector = HashMap::from([(labels::RUN_ID.to_owned(), run_id)]);
        while !stop.load(Ordering::Relaxed) {
            let req = ListSandboxesRequest {
                label_selector: selector.clone(),
            };
            if let Ok(r) = prov.list_sandboxes(req).await {
                let local = r
                    .into_inner()
                    .sandboxes
                    .iter()
                    .filter(|s| s.backend == "local")
                    .count();
                seen.fetch_max(local, Ordering::Relaxed);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
    most
}

/// `forkyard status`: the BACKEND column of forks 1..=n, in order.
fn status_backends(mesh: &Mesh, run_id: &str, n: usize) -> Vec<String> {
    let out = std::process::Command::new(forkyard_tests::mesh::bin_dir().join("forkyard"))
        .args(["--gateway", &mesh.endpoint("gateway"), "status", run_id])
        .output()
        .expect("forkyard runs");
    let out = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = out.lines().collect();
    let column = lines[1].find("BACKEND").unwrap_or_else(|| panic!("{out}"));
    lines[2..2 + n]
        .iter()
        .map(|l| {
            l[column..]
                .split_whitespace()
                .next()
                .unwrap_or("")
                .to_owned()
        })
        .collect()
}

async fn overflow(mesh: &Mesh, gw: &mut Gateway, src: &Path, e2b: &fake_e2b::Fake) {
    let shares = vec![share("local", 4), share("e2b", 0)];
    let req = over(src, 10, shares.clone());
    let run_id = gw
        .launch_run(req)
        .await
        .expect("launch")
        .into_inner()
        .run_id;
    let stop = Arc::new(AtomicBool::new(false));
    let most_local = sample_local(mesh, &run_id, stop.clone());
    let run = wait_finished(gw, &run_id, Duration::from_secs(180)).await;
    stop.store(true, Ordering::Relaxed);
    let spec = run.spec.clone().unwrap();
    assert_eq!(spec.backends, shares);
    let expected: Vec<&str> = (1..=10)
        .map(|f| if f <= 4 { "local" } else { "e2b" })
        .collect();
    assert_eq!(
        backends_of(gw, &run).await,
        expected,
        "the first four fill local's share, the rest overflow to e2b"
    );
    assert_eq!(status_backends(mesh, &run_id, 10), expected);
    let most = most_local.load(Ordering::Relaxed);
    assert!((1..=4).contains(&most), "local sandboxes at once: {most}");
    assert_eq!(e2b.templates.lock().unwrap().len(), 6, "six creates on E2B");
    assert!(
        e2b.sandboxes.lock().unwrap().is_empty(),
        "every E2B sandbox destroyed"
    );
    // One account for the whole run, whatever backend each fork ran on.
    let mut ledger = BudgetLedgerClient::new(mesh.channel("budget-ledger").await.unwrap());
    let account = run_account(&mut ledger, &run_id).await;
    assert_eq!(account.spent_micros, run.cost_micros, "{account:?}");
    assert_eq!(account.reserved_micros, 0);
    let forks: i64 = run.forks.iter().map(|f| f.cost_micros).sum();
    assert_eq!(
        forks, run.cost_micros,
        "the run's cost is its forks' to the micro-dollar"
    );
    let on_e2b: Vec<i64> = run.forks[4..].iter().map(|f| f.cost_micros).collect();
    assert!(
        on_e2b.iter().all(|c| *c > 0),
        "every fork on E2B paid for its sandbox: {on_e2b:?}"
    );
    assert_eq!(run.ranking.len(), 10, "one ranking of every fork");
    assert_eq!(
        workspaces_left(mesh.state_dir()).len(),
        0,
        "every local sandbox is gone"
    );
}

async fn failover(gw: &mut Gateway, src: &Path, e2b: &fake_e2b::Fake) {
    let creates_before = e2b.templates.lock().unwrap().len();
    *e2b.fail.lock().unwrap() = Some((503, 10_000));
    let req = over(src, 3, vec![share("e2b", 2), share("local", 0)]);
    let run_id = gw
        .launch_run(req)
        .await
        .expect("launch")
        .into_inner()
        .run_id;
    let run = wait_finished(gw, &run_id, Duration::from_secs(180)).await;
    *e2b.fail.lock().unwrap() = None;
    assert_eq!(
        backends_of(gw, &run).await,
        ["local", "local", "local"],
        "E2B refused every create: its forks went on to local"
    );
    assert_eq!(
        e2b.templates.lock().unwrap().len(),
        creates_before,
        "nothing made on E2B"
    );
}

/// E2B refuses every create and local's one place is taken by fork 3 (placed there
/// while forks 1 and 2 went to E2B) for 12 s: forks 1 and 2 wait for room, pending
/// and holding nothing, then run on local in turn.
async fn waits_for_room(mesh: &Mesh, gw: &mut Gateway, src: &Path, e2b: &fake_e2b::Fake) {
    *e2b.fail.lock().unwrap() = Some((503, 10_000));
    let agent = format!("if [ \"$FORKYARD_FORK\" = 3 ]; then sleep 12; fi; {AGENT}");
    let req = LaunchRunRequest {
        backends: vec![share("e2b", 2), share("local", 1)],
        ..launch(src, 3, 3, &agent)
    };
    let run_id = gw
        .launch_run(req)
        .await
        .expect("launch")
        .into_inner()
        .run_id;
    let waiting = |run: &Run| {
        run.forks[..2]
            .iter()
            .all(|f| f.phase == "waiting for room" && f.status == ForkStatus::Pending as i32)
    };
    let run = wait_until(gw, &run_id, Duration::from_secs(60), waiting).await;
    for f in &run.forks[..2] {
        assert!(
            f.error.starts_with("e2b refused its create (")
                && f.error.ends_with("waiting for room on local"),
            "{f:#?}"
        );
        assert!(f.backend.is_empty(), "on no backend while it waits: {f:#?}");
    }
    assert_eq!(run.forks[2].backend, "local", "{:#?}", run.forks[2]);
    // While they wait they hold no budget: only fork 3's reservation is out.
    let mut ledger = BudgetLedgerClient::new(mesh.channel("budget-ledger").await.unwrap());
    let account = run_account(&mut ledger, &run_id).await;
    let fork_budget = run.spec.as_ref().unwrap().fork_budget_micros;
    assert_eq!(account.reserved_micros, fork_budget, "{account:?}");
    let run = wait_finished(gw, &run_id, Duration::from_secs(180)).await;
    *e2b.fail.lock().unwrap() = None;
    assert_eq!(backends_of(gw, &run).await, ["local", "local", "local"]);
    // Local's share held: each started on it after the one before ended (fork 3, the
    // long one, first). (ListSandboxes cannot be sampled: E2B fails its listing too.)
    let f = &run.forks;
    assert!(
        f[0].sandbox_ready_unix_ms >= f[2].finished_unix_ms,
        "{f:#?}"
    );
    assert!(
        f[1].sandbox_ready_unix_ms >= f[0].finished_unix_ms,
        "{f:#?}"
    );
    let account = run_account(&mut ledger, &run_id).await;
    assert_eq!(account.spent_micros, run.cost_micros, "{account:?}");
    assert_eq!(account.reserved_micros, 0);
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

async fn bad_input(gw: &mut Gateway, src: &Path) {
    let cases = [
        (
            vec![share("local", 2), share("local", 0)],
            "",
            "backends[1].name",
        ),
        (
            vec![share("local", 2), share("modal", 0)],
            "",
            "backends[1].name",
        ),
        (
            vec![share("e2b", 0), share("local", 0)],
            "",
            "backends[0].max_concurrent",
        ),
        (
            vec![share("local", 2), share("e2b", 0)],
            "local",
            "backends",
        ),
    ];
    for (backends, backend, field) in cases {
        let req = LaunchRunRequest {
            backend: backend.into(),
            ..over(src, 2, backends)
        };
        assert_refused(gw, req, Code::InvalidArgument, field).await;
    }
}

/// The provisioner cannot run runsc (FORKYARD_RUNSC_PATH points nowhere): a run asking
/// for gVisor is refused at launch saying why, before any fork is made.
async fn gvisor_refused_at_launch(gw: &mut Gateway, src: &Path, state: &Path) {
    let before = workspaces_left(state).len();
    let req = LaunchRunRequest {
        isolation: "gvisor".into(),
        ..launch(src, 2, 2, AGENT)
    };
    let e = gw.launch_run(req).await.expect_err("refused");
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    let m = e.message();
    assert!(
        m.starts_with("isolation: gvisor is not available on the local backend: ")
            && m.contains("/nonexistent/runsc"),
        "{m}"
    );
    assert_eq!(workspaces_left(state).len(), before, "nothing was made");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_run_over_local_and_e2b_overflows_and_fails_over() {
    let e2b = fake_e2b::start(KEY).await;
    let model = ScriptedModel::start(Script::edit("true")).await;
    let mesh = Mesh::start_with(options(&e2b.url, &model.url))
        .await
        .expect("mesh");
    let src = mesh.state_dir().join("repo");
    repo::create(&src).unwrap();
    let mut gw = Gateway::new(mesh.channel("gateway").await.unwrap());

    bad_input(&mut gw, &src).await;
    gvisor_refused_at_launch(&mut gw, &src, mesh.state_dir()).await;
    overflow(&mesh, &mut gw, &src, &e2b.fake).await;
    failover(&mut gw, &src, &e2b.fake).await;
    waits_for_room(&mesh, &mut gw, &src, &e2b.fake).await;
}
