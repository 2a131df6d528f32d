//! End to end: the real mesh runs multi-fork runs, keeps the ledger exact, leaks nothing,
//! cancels cleanly, refuses bad input, and answers grpcurl through reflection.

use forkyard_proto::{
    budget::v1::{GetAccountRequest, budget_ledger_client::BudgetLedgerClient},
    common::v1::{AgentSpec, ForkStatus},
    gateway::v1::{
        CancelRunRequest, GetRunRequest, LaunchRunRequest, ListRunsRequest, RunState,
        gateway_client::GatewayClient,
    },
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
        fork_result, grpcurl, launch, max_overlap, run_account, sandbox_processes, wait_finished,
        workspaces_left,
    },
};
use std::{
    collections::HashMap,
    path::Path,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};
use tonic::{Code, transport::Channel};

/// Each fork writes its own file and edits a shared one differently, then reports a
/// cost of (fork × 10,000 + 5,000) micro-USD the way `claude -p --output-format json` does.
const AGENT: &str = r#"echo "fork $FORKYARD_FORK says: $FORKYARD_PROMPT" > "fork-$FORKYARD_FORK.txt"
sed -i "s/two/two (fork $FORKYARD_FORK)/" src/lib.txt
sleep 1.5
printf '{"type":"result","total_cost_usd":0.0%d5,"usage":{"input_tokens":100,"output_tokens":20}}\n' "$FORKYARD_FORK""#;

/// Samples how many of the run's sandboxes are alive, until stopped; returns the maximum.
fn watch_sandboxes(
    mut prov: SandboxProvisionerClient<Channel>,
    run_id: String,
    stop: Arc<AtomicUsize>,
) -> tokio::task::JoinHandle<usize> {
    tokio::spawn(async move {
        let mut max = 0;
        while stop.load(Ordering::Relaxed) == 0 {
            let req = ListSandboxesRequest {
                label_selector: HashMap::from([(labels::RUN_ID.to_owned(), run_id.clone())]),
            };
            if let Ok(resp) = prov.list_sandboxes(req).await {
                max = max.max(resp.into_inner().sandboxes.len());
            }
            tokio::time::sleep(Duration::from_millis(40)).await;
        }
        max
    })
}

/// A sandbox made directly through the provisioner, outside any run workflow.
async fn stray_sandbox(
    prov: &mut SandboxProvisionerClient<Channel>,
    repo: &Path,
    owner: Option<&str>,
) -> String {
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_forks_two_at_a_time_complete_with_exact_ledger_and_no_leaks() {
    let mesh = Mesh::start().await.expect("mesh starts");
    let src = tempfile::tempdir().unwrap();
    let base = repo::create(src.path()).unwrap();
    let mut gw = GatewayClient::new(mesh.channel("gateway").await.unwrap());
    let prov = SandboxProvisionerClient::new(mesh.channel("sandbox-provisioner").await.unwrap());

    let launched = gw
        .launch_run(LaunchRunRequest {
            request_id: "e2e-three".into(),
            ..launch(src.path(), 3, 2, AGENT)
        })
        .await
        .expect("launch")
        .into_inner();
    assert!(launched.created);
    assert_eq!(launched.run_id, "run-e2e-three");
    let stop = Arc::new(AtomicUsize::new(0));
    let watcher = watch_sandboxes(prov.clone(), launched.run_id.clone(), stop.clone());

    // Launching again with the same request id starts nothing new.
    let again = gw
        .launch_run(LaunchRunRequest {
            request_id: "e2e-three".into(),
            ..launch(src.path(), 3, 2, AGENT)
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(again.run_id, launched.run_id);
    assert!(!again.created);

    let run = wait_finished(&mut gw, &launched.run_id, Duration::from_secs(180)).await;
    stop.store(1, Ordering::Relaxed);
    let max_alive = watcher.await.unwrap();

    assert_eq!(run.state, RunState::Completed as i32, "{run:#?}");
    assert_eq!(run.forks.len(), 3);
    assert_eq!(run.forks_succeeded, 3, "{run:#?}");
    assert!(max_alive >= 1, "the watcher never saw a sandbox");
    assert!(
        max_alive <= 2,
        "{max_alive} sandboxes alive at once with max_concurrent=2"
    );
    // Sampling can miss a short overlap; the forks' own lifetimes cannot.
    assert_eq!(
        max_overlap(&run.forks),
        2,
        "forks in flight at once: {:#?}",
        run.forks
    );

    let mut patches = Vec::new();
    for summary in &run.forks {
        assert!(
            summary.patch.is_empty(),
            "the run listing carries no patches"
        );
        let f = &fork_result(&mut gw, &launched.run_id, summary.fork).await;
        assert_eq!(
            f.status,
            ForkStatus::Succeeded as i32,
            "fork {}: {}",
            f.fork,
            f.error
        );
        assert_eq!(f.branch, format!("forkyard-fork-{}", f.fork));
        assert_eq!(f.base_commit, base);
        assert!(
            f.patch
                .contains(&format!("+fork {} says: make it better", f.fork)),
            "fork {} patch:\n{}",
            f.fork,
            f.patch
        );
        assert!(
            f.patch.contains(&format!("+two (fork {})", f.fork)),
            "fork {} patch:\n{}",
            f.fork,
            f.patch
        );
        let d = f.diffstat.expect("diffstat");
        assert_eq!(
            (d.files_changed, d.insertions, d.deletions),
            (2, 2, 1),
            "fork {}",
            f.fork
        );
        assert_eq!(f.cost_micros, i64::from(f.fork) * 10_000 + 5_000);
        patches.push(f.patch.clone());
    }
    patches.sort();
    patches.dedup();
    assert_eq!(patches.len(), 3, "each fork has its own patch");

    // The ledger agrees with the forks to the micro-dollar, and nothing stays reserved.
    let mut ledger = BudgetLedgerClient::new(mesh.channel("budget-ledger").await.unwrap());
    let account = ledger
        .get_account(GetAccountRequest {
            account_id: launched.run_id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    let total: i64 = run.forks.iter().map(|f| f.cost_micros).sum();
    assert_eq!(total, 75_000);
    assert_eq!(run.cost_micros, total);
    assert_eq!(account.spent_micros, total);
    assert_eq!(account.reserved_micros, 0);
    assert_eq!(account.available_micros, 1_000_000 - total);

    // Nothing leaks: no sandbox, no workspace, no process.
    let left = prov
        .clone()
        .list_sandboxes(ListSandboxesRequest::default())
        .await
        .unwrap()
        .into_inner()
        .sandboxes;
    assert!(left.is_empty(), "sandboxes left: {left:?}");
    assert!(
        workspaces_left(mesh.state_dir()).is_empty(),
        "{:?}",
        workspaces_left(mesh.state_dir())
    );
    assert!(
        sandbox_processes(mesh.state_dir()).is_empty(),
        "{:?}",
        sandbox_processes(mesh.state_dir())
    );

    // The real grpcurl sees every service through reflection and can call GetRun.
    let apis = [
        ("gateway", "forkyard.gateway.v1.Gateway"),
        (
            "sandbox-provisioner",
            "forkyard.sandbox.v1.SandboxProvisioner",
        ),
        ("agent-runner", "forkyard.agent.v1.AgentRunner"),
        ("budget-ledger", "forkyard.budget.v1.BudgetLedger"),
        ("janitor", "forkyard.janitor.v1.Janitor"),
    ];
    for (service, api) in apis {
        let addr = format!("127.0.0.1:{}", mesh.port(service));
        let listed = grpcurl(&["-plaintext", &addr, "list"]);
        assert!(
            listed.contains("grpc.health.v1.Health"),
            "{service}: {listed}"
        );
        let forkyard_apis: Vec<&str> = listed
            .lines()
            .filter(|l| l.starts_with("forkyard."))
            .collect();
        assert_eq!(
            forkyard_apis,
            vec![api],
            "{service} advertises exactly its own API"
        );
        let health = grpcurl(&[
            "-plaintext",
            "-d",
            "{}",
            &addr,
            "grpc.health.v1.Health/Check",
        ]);
        assert!(health.contains("SERVING"), "{service}: {health}");
    }
    let gw_addr = format!("127.0.0.1:{}", mesh.port("gateway"));
    let described = grpcurl(&[
        "-plaintext",
        &gw_addr,
        "describe",
        "forkyard.gateway.v1.Gateway",
    ]);
    assert!(described.contains("rpc LaunchRun"), "{described}");
    let body = format!(r#"{{"run_id":"{}"}}"#, launched.run_id);
    let got = grpcurl(&[
        "-plaintext",
        "-d",
        &body,
        &gw_addr,
        "forkyard.gateway.v1.Gateway/GetRun",
    ]);
    let json: serde_json::Value = serde_json::from_str(&got).unwrap();
    assert_eq!(json["state"], "RUN_STATE_COMPLETED", "{got}");
    assert_eq!(json["forksSucceeded"], 3, "{got}");

    // SIGTERM: every service drains and exits cleanly.
    let mut mesh = mesh;
    for service in forkyard_tests::mesh::SERVICES {
        let status = mesh.terminate(service, Duration::from_secs(20));
        assert!(
            status.is_some_and(|s| s.success()),
            "{service} on SIGTERM: {status:?}\n{}",
            mesh.log_tail(service)
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_and_janitor_destroy_sandboxes_and_bad_launches_start_nothing() {
    let mesh = Mesh::start().await.expect("mesh starts");
    let src = tempfile::tempdir().unwrap();
    repo::create(src.path()).unwrap();
    let mut gw = GatewayClient::new(mesh.channel("gateway").await.unwrap());
    let mut prov =
        SandboxProvisionerClient::new(mesh.channel("sandbox-provisioner").await.unwrap());

    // Bad input: refused with the field named, and no run appears.
    let cases: Vec<(LaunchRunRequest, Code, &str)> = vec![
        (
            LaunchRunRequest {
                forks: 0,
                ..launch(src.path(), 1, 1, "true")
            },
            Code::InvalidArgument,
            "forks",
        ),
        (
            LaunchRunRequest {
                prompt: String::new(),
                ..launch(src.path(), 1, 1, "true")
            },
            Code::InvalidArgument,
            "prompt",
        ),
        (
            launch(src.path(), 1, 0, "true"),
            Code::InvalidArgument,
            "max_concurrent",
        ),
        (
            LaunchRunRequest {
                budget_usd: "-3".into(),
                ..launch(src.path(), 1, 1, "true")
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
                ..launch(src.path(), 1, 1, "true")
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
            launch(mesh.state_dir(), 1, 1, "true"),
            Code::FailedPrecondition,
            "repo",
        ),
        (
            LaunchRunRequest {
                base_ref: "no-such-branch".into(),
                ..launch(src.path(), 1, 1, "true")
            },
            Code::InvalidArgument,
            "base_ref",
        ),
        (
            LaunchRunRequest {
                base_ref: "--upload-pack=touch /tmp/x".into(),
                ..launch(src.path(), 1, 1, "true")
            },
            Code::InvalidArgument,
            "base_ref",
        ),
        (
            LaunchRunRequest {
                base_ref: "HEAD~5".into(),
                ..launch(src.path(), 1, 1, "true")
            },
            Code::InvalidArgument,
            "base_ref",
        ),
    ];
    for (i, (req, code, field)) in cases.into_iter().enumerate() {
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

    // A run whose agents would take minutes is cancelled once its sandboxes exist.
    let launched = gw
        .launch_run(LaunchRunRequest {
            request_id: "e2e-cancel".into(),
            ..launch(src.path(), 4, 2, "sleep 300")
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

    // A live sandbox's workspace is nobody's repository: not by path, not as file://.
    let ws = mesh
        .state_dir()
        .join("sandboxes")
        .join(&live)
        .join("workspace");
    assert!(ws.join(".git").is_dir(), "{}", ws.display());
    for (i, repo) in [
        format!("file://{}", ws.display()),
        format!("file://localhost{}/.", ws.display()),
        ws.display().to_string(),
    ]
    .into_iter()
    .enumerate()
    {
        let req = LaunchRunRequest {
            request_id: format!("steal-{i}"),
            repo: repo.clone(),
            ..launch(src.path(), 1, 1, "true")
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

    // The janitor destroys sandboxes whose owner is unknown, and never a running run's.
    let mut janitor = JanitorClient::new(mesh.channel("janitor").await.unwrap());
    let ghost = stray_sandbox(&mut prov, src.path(), Some("run-ghost/fork-1")).await;
    let unlabelled = stray_sandbox(&mut prov, src.path(), None).await;
    let dry = janitor
        .sweep_now(SweepRequest {
            max_age_secs: 0,
            heartbeat_grace_secs: 0,
            dry_run: true,
            min_age_secs: 0,
        })
        .await
        .unwrap()
        .into_inner();
    let mut want = vec![
        (ghost.clone(), "workflow not found".to_owned(), false),
        (unlabelled.clone(), "no owner label".to_owned(), false),
    ];
    want.sort();
    assert_eq!(acted_on(&dry), want, "dry run reports the orphans only");
    assert_eq!(dry.examined, 4);
    let swept = janitor
        .sweep_now(SweepRequest {
            max_age_secs: 0,
            heartbeat_grace_secs: 0,
            dry_run: false,
            min_age_secs: 0,
        })
        .await
        .unwrap()
        .into_inner();
    for w in &mut want {
        w.2 = true;
    }
    assert_eq!(acted_on(&swept), want);
    let alive = prov
        .list_sandboxes(ListSandboxesRequest::default())
        .await
        .unwrap()
        .into_inner()
        .sandboxes;
    assert_eq!(
        alive.len(),
        2,
        "the run's two sandboxes are untouched: {alive:?}"
    );
    assert!(
        alive
            .iter()
            .all(|s| s.labels.get(labels::RUN_ID) == Some(&launched.run_id) && s.running_execs > 0)
    );

    gw.cancel_run(CancelRunRequest {
        run_id: launched.run_id.clone(),
        reason: "test".into(),
    })
    .await
    .unwrap();
    let run = wait_finished(&mut gw, &launched.run_id, Duration::from_secs(60)).await;
    assert_eq!(run.state, RunState::Cancelled as i32, "{run:#?}");
    for f in &run.forks {
        assert_eq!(
            f.status,
            ForkStatus::Cancelled as i32,
            "fork {}: {f:?}",
            f.fork
        );
    }
    let left = prov
        .list_sandboxes(ListSandboxesRequest::default())
        .await
        .unwrap()
        .into_inner()
        .sandboxes;
    assert!(left.is_empty(), "sandboxes left after cancel: {left:?}");
    assert!(
        workspaces_left(mesh.state_dir()).is_empty(),
        "{:?}",
        workspaces_left(mesh.state_dir())
    );
    assert!(
        sandbox_processes(mesh.state_dir()).is_empty(),
        "{:?}",
        sandbox_processes(mesh.state_dir())
    );

    let mut ledger = BudgetLedgerClient::new(mesh.channel("budget-ledger").await.unwrap());
    let account = ledger
        .get_account(GetAccountRequest {
            account_id: launched.run_id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        account.reserved_micros, 0,
        "cancelled forks released their reservations"
    );
    assert_eq!(account.spent_micros, 0);

    // A sandbox claiming a closed workflow (the run, owner of its inline forks) is an
    // orphan too.
    let closed_owner = launched.run_id.clone();
    let stale = stray_sandbox(&mut prov, src.path(), Some(&closed_owner)).await;
    let swept = janitor
        .sweep_now(SweepRequest {
            max_age_secs: 0,
            heartbeat_grace_secs: 0,
            dry_run: false,
            min_age_secs: 0,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(swept.actions.len(), 1, "{swept:?}");
    assert_eq!(swept.actions[0].sandbox_id, stale);
    assert!(
        swept.actions[0].reason.starts_with("workflow closed"),
        "{swept:?}"
    );
    assert!(swept.actions[0].destroyed);
    assert!(workspaces_left(mesh.state_dir()).is_empty());

    // Cancelling a finished run is a precondition failure, an unknown run is not found.
    let again = gw
        .cancel_run(CancelRunRequest {
            run_id: launched.run_id.clone(),
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

/// A wave wider than one preparation activity (100 forks) is prepared in several at
/// once; every fork gets its own sandbox and its own outcome back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wave_wider_than_one_preparation_activity_runs_every_fork_in_its_own_sandbox() {
    let mesh = Mesh::start().await.expect("mesh starts");
    let src = tempfile::tempdir().unwrap();
    repo::create(src.path()).unwrap();
    let mut gw = GatewayClient::new(mesh.channel("gateway").await.unwrap());
    let forks = 130;
    let agent = r#"echo "$FORKYARD_FORK" > which.txt"#;
    let run_id = gw
        .launch_run(LaunchRunRequest {
            budget_usd: "10".into(),
            ..launch(src.path(), forks, forks, agent)
        })
        .await
        .unwrap()
        .into_inner()
        .run_id;
    let run = wait_finished(&mut gw, &run_id, Duration::from_secs(600)).await;
    assert_eq!(run.forks_succeeded, forks, "{run:#?}");
    let sandboxes: std::collections::HashSet<&str> =
        run.forks.iter().map(|f| f.sandbox_id.as_str()).collect();
    assert_eq!(sandboxes.len(), forks as usize, "one sandbox per fork");
    assert!(run.forks.iter().all(|f| f.sandbox_ready_unix_ms > 0));
    // Each fork's patch is its own agent's work, on both sides of the 100-fork boundary.
    for fork in [1, 100, 101, forks] {
        let r = fork_result(&mut gw, &run_id, fork).await;
        assert!(
            r.patch.contains(&format!("+{fork}\n")),
            "fork {fork}: {}",
            r.patch
        );
    }
    let mut ledger = BudgetLedgerClient::new(mesh.channel("budget-ledger").await.unwrap());
    let account = run_account(&mut ledger, &run_id).await;
    assert_eq!(account.reserved_micros, 0, "{account:#?}");
    assert_eq!(account.spent_micros, run.cost_micros);
    assert!(
        sandbox_processes(mesh.state_dir()).is_empty(),
        "{:?}",
        sandbox_processes(mesh.state_dir())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_in_which_no_fork_succeeds_is_failed_with_the_reason() {
    let mesh = Mesh::start().await.expect("mesh starts");
    let src = tempfile::tempdir().unwrap();
    repo::create(src.path()).unwrap();
    let mut gw = GatewayClient::new(mesh.channel("gateway").await.unwrap());
    let failing = gw
        .launch_run(LaunchRunRequest {
            request_id: "all-fail".into(),
            ..launch(src.path(), 2, 2, "echo broken >&2; exit 3")
        })
        .await
        .unwrap()
        .into_inner()
        .run_id;
    let fine = gw
        .launch_run(LaunchRunRequest {
            request_id: "one-fine".into(),
            ..launch(
                src.path(),
                2,
                2,
                "[ \"$FORKYARD_FORK\" = 1 ] && echo ok >> README.md",
            )
        })
        .await
        .unwrap()
        .into_inner()
        .run_id;
    let run = wait_finished(&mut gw, &failing, Duration::from_secs(90)).await;
    assert_eq!(run.state, RunState::Failed as i32, "{run:#?}");
    assert!(
        run.error.starts_with("no fork succeeded (2 forks); fork "),
        "{}",
        run.error
    );
    let other = wait_finished(&mut gw, &fine, Duration::from_secs(90)).await;
    assert_eq!(
        other.state,
        RunState::Completed as i32,
        "one of two succeeded: {other:#?}"
    );

    // ListRuns agrees, by state and in its summaries.
    let list = |state: RunState| {
        let mut gw = gw.clone();
        async move {
            gw.list_runs(ListRunsRequest {
                state: state as i32,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner()
            .runs
        }
    };
    let mut failed = Vec::new();
    for _ in 0..50 {
        // Visibility follows the close by a moment.
        failed = list(RunState::Failed).await;
        if !failed.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        failed.iter().map(|r| r.run_id.as_str()).collect::<Vec<_>>(),
        [failing.as_str()]
    );
    assert_eq!(failed[0].state, RunState::Failed as i32);
    let completed = list(RunState::Completed).await;
    assert_eq!(
        completed
            .iter()
            .map(|r| r.run_id.as_str())
            .collect::<Vec<_>>(),
        [fine.as_str()]
    );

    // `forkyard watch` exits 3 for a failed run, 2 for one with some forks failed.
    for (run_id, code) in [(&failing, 3), (&fine, 2)] {
        let out = std::process::Command::new(forkyard_tests::mesh::bin_dir().join("forkyard"))
            .args([
                "--gateway",
                &mesh.endpoint("gateway"),
                "-o",
                "json",
                "watch",
                run_id,
            ])
            .output()
            .unwrap();
        assert_eq!(
            out.status.code(),
            Some(code),
            "{run_id}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
