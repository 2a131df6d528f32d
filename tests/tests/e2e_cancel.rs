//! End to end: bad launches start nothing, a live sandbox's workspace is no one's
//! repository, the janitor destroys orphans and spares a running run, and a cancelled run
//! leaves no sandbox, workspace, process or reservation behind.

use forkyard_proto::{
    budget::v1::budget_ledger_client::BudgetLedgerClient,
    common::v1::{AgentSpec, ForkStatus},
    gateway::v1::{CancelRunRequest, GetRunRequest, LaunchRunRequest, RunState},
    janitor::v1::{SweepReport, SweepRequest, janitor_client::JanitorClient},
    labels,
    sandbox::v1::{
        CreateSandboxRequest, ListSandboxesRequest,
        sandbox_provisioner_client::SandboxProvisionerClient,
    },
};
use forkyard_tests::{
    Mesh, repo,
    support::{
        Gateway, assert_nothing_left_on_host, launch, run_account, wait_finished, workspaces_left,
    },
};
use std::{
    collections::HashMap,
    path::Path,
    time::{Duration, Instant},
};
use tonic::{Code, transport::Channel};

type Provisioner = SandboxProvisionerClient<Channel>;
type Janitor = JanitorClient<Channel>;

/// A sandbox made directly through the provisioner, outside any run workflow.
async fn stray_sandbox(prov: &mut Provisioner, repo: &Path, owner: Option<&str>) -> String {
    let labels = owner
        .map(|wf| HashMap::from([(labels::WORKFLOW_ID.to_owned(), wf.to_owned())]))
        .unwrap_or_default();
    let req = CreateSandboxRequest {
        repo: repo.to_string_lossy().into_owned(),
        branch: "stray".into(),
        labels,
        ..Default::default()
    };
    prov.create_sandbox(req)
        .await
        .expect("create stray sandbox")
        .into_inner()
        .id
}

fn acted_on(report: &SweepReport) -> Vec<(String, String, bool)> {
    let mut v: Vec<_> = report
        .actions
        .iter()
        .map(|a| (a.sandbox_id.clone(), a.reason.clone(), a.destroyed))
        .collect();
    v.sort();
    v
}

/// A sweep with every age and grace at zero, so only ownership decides.
async fn sweep(janitor: &mut Janitor, dry_run: bool) -> SweepReport {
    janitor
        .sweep_now(SweepRequest {
            max_age_secs: 0,
            heartbeat_grace_secs: 0,
            dry_run,
            min_age_secs: 0,
        })
        .await
        .unwrap()
        .into_inner()
}

async fn all_sandboxes(prov: &mut Provisioner) -> Vec<forkyard_proto::sandbox::v1::Sandbox> {
    prov.list_sandboxes(ListSandboxesRequest::default())
        .await
        .unwrap()
        .into_inner()
        .sandboxes
}

/// Each launch refused, with the code and the field its message starts with.
fn bad_launches(src: &Path, state_dir: &Path) -> Vec<(LaunchRunRequest, Code, &'static str)> {
    vec![
        (
            LaunchRunRequest {
                forks: 0,
                ..launch(src, 1, 1, "true")
            },
            Code::InvalidArgument,
            "forks",
        ),
        (
            LaunchRunRequest {
                prompt: String::new(),
                ..launch(src, 1, 1, "true")
            },
            Code::InvalidArgument,
            "prompt",
        ),
        (
            launch(src, 1, 0, "true"),
            Code::InvalidArgument,
            "max_concurrent",
        ),
        (
            LaunchRunRequest {
                budget_usd: "-3".into(),
                ..launch(src, 1, 1, "true")
            },
            Code::InvalidArgument,
            "budget_usd",
        ),
        (
            LaunchRunRequest {
                agent: Some(AgentSpec {
                    driver: "telepathy".into(),
                    ..Default::default()
                }),
                ..launch(src, 1, 1, "true")
            },
            Code::InvalidArgument,
            "agent.driver",
        ),
        (
            launch(Path::new("/nonexistent/repo"), 1, 1, "true"),
            Code::InvalidArgument,
            "repo",
        ),
        (
            launch(state_dir, 1, 1, "true"),
            Code::FailedPrecondition,
            "repo",
        ),
        (
            LaunchRunRequest {
                base_ref: "no-such-branch".into(),
                ..launch(src, 1, 1, "true")
            },
            Code::InvalidArgument,
            "base_ref",
        ),
        (
            LaunchRunRequest {
                base_ref: "--upload-pack=touch /tmp/x".into(),
                ..launch(src, 1, 1, "true")
            },
            Code::InvalidArgument,
            "base_ref",
        ),
        (
            LaunchRunRequest {
                base_ref: "HEAD~5".into(),
                ..launch(src, 1, 1, "true")
            },
            Code::InvalidArgument,
            "base_ref",
        ),
    ]
}

/// Bad input: refused with the field named, and no run appears.
async fn assert_bad_launches_start_nothing(gw: &mut Gateway, src: &Path, state_dir: &Path) {
    for (i, (req, code, field)) in bad_launches(src, state_dir).into_iter().enumerate() {
        let req = LaunchRunRequest {
            request_id: format!("bad-{i}"),
            ..req
        };
        let err = gw.launch_run(req).await.expect_err("bad launch accepted");
        assert_eq!(err.code(), code, "case {i}: {err:?}");
        assert!(
            err.message().starts_with(field),
            "case {i}: {:?} does not name {field}",
            err.message()
        );
        let missing = gw
            .get_run(GetRunRequest {
                run_id: format!("run-bad-{i}"),
            })
            .await;
        assert_eq!(
            missing.expect_err("run started").code(),
            Code::NotFound,
            "case {i}"
        );
    }
}

/// A run whose agents would take minutes, launched and waited on until both of its first
/// two sandboxes run their agent: its id and one of those sandboxes.
async fn launch_sleepers(gw: &mut Gateway, prov: &mut Provisioner, src: &Path) -> (String, String) {
    let launched = gw
        .launch_run(LaunchRunRequest {
            request_id: "e2e-cancel".into(),
            ..launch(src, 4, 2, "sleep 300")
        })
        .await
        .unwrap()
        .into_inner();
    let selector = HashMap::from([(labels::RUN_ID.to_owned(), launched.run_id.clone())]);
    let deadline = Instant::now() + Duration::from_secs(60);
    let live = loop {
        let alive = prov
            .list_sandboxes(ListSandboxesRequest {
                label_selector: selector.clone(),
            })
            .await
            .unwrap()
            .into_inner()
            .sandboxes;
        if alive.len() == 2 && alive.iter().all(|s| s.running_execs > 0) {
            break alive[0].id.clone();
        }
        assert!(Instant::now() < deadline, "agents never started: {alive:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    (launched.run_id, live)
}

/// A live sandbox's workspace is nobody's repository: not by path, not as file://, nor
/// its overlay's own layer (where the sandbox's `.git` changes land).
async fn assert_live_workspace_is_no_repo(gw: &mut Gateway, mesh: &Mesh, src: &Path, live: &str) {
    let dir = mesh.state_dir().join("sandboxes").join(live);
    let (ws, upper) = (dir.join("workspace"), dir.join("upper"));
    // An overlay's workspace directory is its mount point, empty on the host.
    let own = if upper.is_dir() { &upper } else { &ws };
    assert!(own.join(".git").is_dir(), "{}", own.display());
    for (i, repo) in [
        format!("file://{}", ws.display()),
        format!("file://localhost{}/.", ws.display()),
        ws.display().to_string(),
        upper.display().to_string(),
    ]
    .into_iter()
    .enumerate()
    {
        let req = LaunchRunRequest {
            request_id: format!("steal-{i}"),
            repo: repo.clone(),
            ..launch(src, 1, 1, "true")
        };
        let err = gw.launch_run(req).await.expect_err(&repo);
        assert_eq!(err.code(), Code::InvalidArgument, "{repo}: {err:?}");
        assert!(err.message().starts_with("repo"), "{}", err.message());
        let missing = gw
            .get_run(GetRunRequest {
                run_id: format!("run-steal-{i}"),
            })
            .await;
        assert_eq!(missing.expect_err("run started").code(), Code::NotFound);
    }
}

/// The janitor destroys sandboxes whose owner is unknown, and never a running run's.
async fn assert_janitor_spares_the_running_run(
    janitor: &mut Janitor,
    prov: &mut Provisioner,
    src: &Path,
    run_id: &str,
) {
    let ghost = stray_sandbox(prov, src, Some("run-ghost/fork-1")).await;
    let unlabelled = stray_sandbox(prov, src, None).await;
    let dry = sweep(janitor, true).await;
    let mut want = vec![
        (ghost.clone(), "workflow not found".to_owned(), false),
        (unlabelled.clone(), "no owner label".to_owned(), false),
    ];
    want.sort();
    assert_eq!(acted_on(&dry), want, "dry run reports the orphans only");
    assert_eq!(dry.examined, 4);
    let swept = sweep(janitor, false).await;
    for w in &mut want {
        w.2 = true;
    }
    assert_eq!(acted_on(&swept), want);
    let alive = all_sandboxes(prov).await;
    assert_eq!(
        alive.len(),
        2,
        "the run's two sandboxes are untouched: {alive:?}"
    );
    assert!(alive.iter().all(
        |s| s.labels.get(labels::RUN_ID).map(String::as_str) == Some(run_id) && s.running_execs > 0
    ));
}

/// Cancelled, the run's forks are all cancelled and nothing of them is left: no sandbox,
/// workspace, process, reservation or spend.
async fn cancel_and_assert_nothing_left(
    gw: &mut Gateway,
    prov: &mut Provisioner,
    mesh: &Mesh,
    run_id: &str,
) {
    gw.cancel_run(CancelRunRequest {
        run_id: run_id.to_owned(),
        reason: "test".into(),
    })
    .await
    .unwrap();
    let run = wait_finished(gw, run_id, Duration::from_secs(60)).await;
    assert_eq!(run.state, RunState::Cancelled as i32, "{run:#?}");
    for f in &run.forks {
        assert_eq!(
            f.status,
            ForkStatus::Cancelled as i32,
            "fork {}: {f:?}",
            f.fork
        );
    }
    let left = all_sandboxes(prov).await;
    assert!(left.is_empty(), "sandboxes left after cancel: {left:?}");
    assert_nothing_left_on_host(mesh.state_dir());

    let mut ledger = BudgetLedgerClient::new(mesh.channel("budget-ledger").await.unwrap());
    let account = run_account(&mut ledger, run_id).await;
    assert_eq!(
        account.reserved_micros, 0,
        "cancelled forks released their reservations"
    );
    assert_eq!(account.spent_micros, 0);
}

/// A sandbox claiming a closed workflow (the run, owner of its inline forks) is an
/// orphan too.
async fn assert_a_closed_owner_makes_an_orphan(
    janitor: &mut Janitor,
    prov: &mut Provisioner,
    mesh: &Mesh,
    src: &Path,
    closed_owner: &str,
) {
    let stale = stray_sandbox(prov, src, Some(closed_owner)).await;
    let swept = sweep(janitor, false).await;
    assert_eq!(swept.actions.len(), 1, "{swept:?}");
    assert_eq!(swept.actions[0].sandbox_id, stale);
    assert!(
        swept.actions[0].reason.starts_with("workflow closed"),
        "{swept:?}"
    );
    assert!(swept.actions[0].destroyed);
    assert!(workspaces_left(mesh.state_dir()).is_empty());
}

/// Cancelling a finished run is a precondition failure, an unknown run is not found.
async fn assert_cancel_refused(gw: &mut Gateway, finished: &str) {
    let again = gw
        .cancel_run(CancelRunRequest {
            run_id: finished.to_owned(),
            reason: String::new(),
        })
        .await;
    assert_eq!(
        again.expect_err("cancel of a closed run").code(),
        Code::FailedPrecondition
    );
    let unknown = gw
        .cancel_run(CancelRunRequest {
            run_id: "run-nope".into(),
            reason: String::new(),
        })
        .await;
    assert_eq!(unknown.expect_err("unknown run").code(), Code::NotFound);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_and_janitor_destroy_sandboxes_and_bad_launches_start_nothing() {
    let mesh = Mesh::start().await.expect("mesh starts");
    let src = tempfile::tempdir().unwrap();
    repo::create(src.path()).unwrap();
    let mut gw = Gateway::new(mesh.channel("gateway").await.unwrap());
    let mut prov = Provisioner::new(mesh.channel("sandbox-provisioner").await.unwrap());

    assert_bad_launches_start_nothing(&mut gw, src.path(), mesh.state_dir()).await;
    let (run_id, live) = launch_sleepers(&mut gw, &mut prov, src.path()).await;
    assert_live_workspace_is_no_repo(&mut gw, &mesh, src.path(), &live).await;
    let mut janitor = Janitor::new(mesh.channel("janitor").await.unwrap());
    assert_janitor_spares_the_running_run(&mut janitor, &mut prov, src.path(), &run_id).await;
    cancel_and_assert_nothing_left(&mut gw, &mut prov, &mesh, &run_id).await;
    assert_a_closed_owner_makes_an_orphan(&mut janitor, &mut prov, &mesh, src.path(), &run_id)
        .await;
    assert_cancel_refused(&mut gw, &run_id).await;
}
