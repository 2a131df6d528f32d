//! End to end, the run API beyond launch: pause and resume, cancelling single forks,
//! budget exhaustion and RaiseBudget, verification with ranking and early stop,
//! WatchRun's events, ListRuns' filters, GetForkResult, and the cleanup schedule.

use forkyard_proto::{
    budget::v1::budget_ledger_client::BudgetLedgerClient,
    common::v1::{ForkStatus, VerifyStatus},
    gateway::v1::{
        CancelForkRequest, GetForkResultRequest, LaunchRunRequest, ListRunsRequest,
        PauseRunRequest, RaiseBudgetRequest, ResumeRunRequest, RunState, StartCleanupRequest,
        StopCleanupRequest, WatchRunRequest, run_event::Kind,
    },
    labels,
    sandbox::v1::{ListSandboxesRequest, sandbox_provisioner_client::SandboxProvisionerClient},
};
use forkyard_tests::{
    Mesh, repo,
    support::{Gateway, fork_result, get_run, launch, run_account, wait_finished, wait_until},
};
use std::{collections::HashMap, time::Duration};
use tonic::Code;

const LONG: Duration = Duration::from_secs(120);

fn status_of(run: &forkyard_proto::gateway::v1::Run, fork: u32) -> ForkStatus {
    ForkStatus::try_from(run.forks[fork as usize - 1].status).unwrap()
}

async fn setup() -> (Mesh, tempfile::TempDir, Gateway) {
    let mesh = Mesh::start().await.expect("mesh starts");
    let src = tempfile::tempdir().unwrap();
    repo::create(src.path()).unwrap();
    let gw = Gateway::new(mesh.channel("gateway").await.unwrap());
    (mesh, src, gw)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_holds_new_forks_and_resume_lets_them_run() {
    let (_mesh, src, mut gw) = setup().await;
    let agent = "sleep 2; echo done > out.txt";
    let mut req = launch(src.path(), 3, 1, agent);
    req.labels = HashMap::from([
        ("team".into(), "infra".into()),
        ("case".into(), "pause".into()),
    ]);
    let run_id = gw.launch_run(req).await.unwrap().into_inner().run_id;
    wait_until(&mut gw, &run_id, LONG, |r| r.forks_running == 1).await;

    let paused = gw
        .pause_run(PauseRunRequest {
            run_id: run_id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(paused.state, RunState::Paused as i32);
    // The running fork finishes; the next one does not start while paused.
    let run = wait_until(&mut gw, &run_id, LONG, |r| r.forks_succeeded == 1).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let run2 = get_run(&mut gw, &run_id).await;
    assert_eq!(run2.state, RunState::Paused as i32, "{run:#?}");
    assert_eq!(
        (run2.forks_succeeded, run2.forks_running, run2.forks_pending),
        (1, 0, 2)
    );

    // ListRuns filters by the live state and by labels.
    let listed = |state: RunState, labels: &[(&str, &str)]| ListRunsRequest {
        state: state as i32,
        labels: labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
        ..Default::default()
    };
    let ids = |resp: forkyard_proto::gateway::v1::ListRunsResponse| {
        resp.runs.into_iter().map(|r| r.run_id).collect::<Vec<_>>()
    };
    let mut found = Vec::new();
    for _ in 0..50 {
        found = ids(gw
            .list_runs(listed(RunState::Paused, &[("team", "infra")]))
            .await
            .unwrap()
            .into_inner());
        if !found.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await; // visibility is eventually consistent
    }
    assert_eq!(found, vec![run_id.clone()]);
    assert!(
        ids(gw
            .list_runs(listed(RunState::Paused, &[("team", "web")]))
            .await
            .unwrap()
            .into_inner())
        .is_empty()
    );
    assert!(
        ids(gw
            .list_runs(listed(RunState::Completed, &[]))
            .await
            .unwrap()
            .into_inner())
        .is_empty()
    );

    let resumed = gw
        .resume_run(ResumeRunRequest {
            run_id: run_id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(resumed.state, RunState::Running as i32);
    let run = wait_finished(&mut gw, &run_id, LONG).await;
    assert_eq!(run.state, RunState::Completed as i32);
    assert_eq!(run.forks_succeeded, 3);

    // A finished run cannot be paused; an unknown one is not found.
    let err = gw
        .pause_run(PauseRunRequest {
            run_id: run_id.clone(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    let err = gw
        .resume_run(ResumeRunRequest {
            run_id: "run-nope".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_forks_can_be_cancelled_pending_or_running() {
    let (mesh, src, mut gw) = setup().await;
    // Fork 1 would run for minutes; the others finish quickly.
    let agent = r#"if [ "$FORKYARD_FORK" = 1 ]; then sleep 300; fi; echo "$FORKYARD_FORK" > f.txt"#;
    let run_id = gw
        .launch_run(launch(src.path(), 3, 1, agent))
        .await
        .unwrap()
        .into_inner()
        .run_id;
    wait_until(&mut gw, &run_id, LONG, |r| r.forks_running == 1).await;

    let cancel = |fork: u32| CancelForkRequest {
        run_id: run_id.clone(),
        fork,
        reason: "test".into(),
    };
    gw.cancel_fork(cancel(3))
        .await
        .expect("cancel pending fork 3");
    gw.cancel_fork(cancel(1))
        .await
        .expect("cancel running fork 1");
    let run = wait_finished(&mut gw, &run_id, LONG).await;
    assert_eq!(run.state, RunState::Completed as i32, "{run:#?}");
    assert_eq!(status_of(&run, 1), ForkStatus::Cancelled, "{run:#?}");
    assert_eq!(status_of(&run, 2), ForkStatus::Succeeded, "{run:#?}");
    assert_eq!(status_of(&run, 3), ForkStatus::Cancelled, "{run:#?}");
    assert!(
        run.forks[0].sandbox_id.starts_with("sbx-"),
        "fork 1 had a sandbox"
    );
    assert!(run.forks[2].sandbox_id.is_empty(), "fork 3 never started");
    assert!(forkyard_tests::support::workspaces_left(mesh.state_dir()).is_empty());
    assert!(forkyard_tests::support::sandbox_processes(mesh.state_dir()).is_empty());

    assert_eq!(
        gw.cancel_fork(cancel(0)).await.unwrap_err().code(),
        Code::InvalidArgument
    );
    assert_eq!(
        gw.cancel_fork(cancel(9)).await.unwrap_err().code(),
        Code::FailedPrecondition,
        "run finished"
    );
}

/// Launch three forks, `max_concurrent` at a time, with a `budget_usd` budget; each fork
/// may spend $0.03 and spends $0.02. Returns the run id.
async fn launch_three_spending_2_cents(
    gw: &mut Gateway,
    src: &std::path::Path,
    max_concurrent: u32,
    budget_usd: &str,
) -> String {
    let agent = r#"echo x > f.txt; echo '{"total_cost_usd": 0.02}'"#;
    let mut req = launch(src, 3, max_concurrent, agent);
    req.budget_usd = budget_usd.into();
    req.fork_budget_usd = "0.03".into();
    gw.launch_run(req).await.unwrap().into_inner().run_id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spent_budget_waits_for_raise_budget_and_the_ledger_stays_exact() {
    let (mesh, src, mut gw) = setup().await;
    // One fork at a time; $0.05 covers two reservations, not three.
    let run_id = launch_three_spending_2_cents(&mut gw, src.path(), 1, "0.05").await;

    let waiting = wait_until(&mut gw, &run_id, LONG, |r| {
        r.state == RunState::AwaitingBudget as i32
    })
    .await;
    assert_eq!(waiting.forks_succeeded, 2, "{waiting:#?}");
    assert_eq!(status_of(&waiting, 3), ForkStatus::Pending);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        get_run(&mut gw, &run_id).await.state,
        RunState::AwaitingBudget as i32,
        "it waits, not fails"
    );

    let raise = |amount: &str| RaiseBudgetRequest {
        run_id: run_id.clone(),
        amount_usd: amount.into(),
    };
    for bad in ["-1", "0", "abc", ""] {
        let err = gw.raise_budget(raise(bad)).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{bad:?}: {err:?}");
        assert!(err.message().starts_with("amount_usd"), "{}", err.message());
    }
    let raised = gw.raise_budget(raise("0.05")).await.unwrap().into_inner();
    assert_eq!(raised.budget_micros, 100_000);
    let run = wait_finished(&mut gw, &run_id, LONG).await;
    assert_eq!(run.state, RunState::Completed as i32, "{run:#?}");
    assert_eq!(run.forks_succeeded, 3);
    assert_eq!(run.budget_micros, 100_000);

    let mut ledger = BudgetLedgerClient::new(mesh.channel("budget-ledger").await.unwrap());
    let account = run_account(&mut ledger, &run_id).await;
    assert_eq!(account.spent_micros, 60_000);
    assert_eq!(account.spent_micros, run.cost_micros);
    assert_eq!(account.reserved_micros, 0);
    assert_eq!(account.budget_micros, 100_000);
    assert_eq!(
        gw.raise_budget(raise("1")).await.unwrap_err().code(),
        Code::FailedPrecondition,
        "run finished"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wave_with_budget_for_some_of_its_forks_runs_those_and_waits_for_the_rest() {
    let (mesh, src, mut gw) = setup().await;
    // Three forks start as one wave, whose reserves go to the ledger together; $0.06
    // covers two reservations at once, and after they spent $0.04 what is left does not
    // cover the third.
    let run_id = launch_three_spending_2_cents(&mut gw, src.path(), 3, "0.06").await;

    let waiting = wait_until(&mut gw, &run_id, LONG, |r| {
        r.state == RunState::AwaitingBudget as i32 && r.forks_succeeded == 2
    })
    .await;
    assert_eq!(waiting.forks_succeeded, 2, "{waiting:#?}");
    let pending: Vec<u32> = waiting
        .forks
        .iter()
        .filter(|f| f.status == ForkStatus::Pending as i32)
        .map(|f| f.fork)
        .collect();
    assert_eq!(pending.len(), 1, "the refused fork waits: {waiting:#?}");
    // Its sandbox, made while its reserve was on the way, was destroyed at the refusal:
    // a waiting fork holds nothing (the two finished forks destroyed theirs).
    let mut prov =
        SandboxProvisionerClient::new(mesh.channel("sandbox-provisioner").await.unwrap());
    let alive = prov
        .list_sandboxes(ListSandboxesRequest {
            label_selector: HashMap::from([(labels::RUN_ID.to_owned(), run_id.clone())]),
        })
        .await
        .unwrap()
        .into_inner()
        .sandboxes;
    assert!(alive.is_empty(), "sandboxes left while waiting: {alive:#?}");

    gw.raise_budget(RaiseBudgetRequest {
        run_id: run_id.clone(),
        amount_usd: "0.05".into(),
    })
    .await
    .unwrap();
    let run = wait_finished(&mut gw, &run_id, LONG).await;
    assert_eq!(run.state, RunState::Completed as i32, "{run:#?}");
    assert_eq!(run.forks_succeeded, 3);
    let mut ledger = BudgetLedgerClient::new(mesh.channel("budget-ledger").await.unwrap());
    let account = run_account(&mut ledger, &run_id).await;
    assert_eq!(account.spent_micros, 60_000);
    assert_eq!(account.reserved_micros, 0);
}

/// The seed's create policy (3 tries, 5 s then 10 s apart) for a wave: a provisioner that
/// is back within it loses no fork; one that is not fails the forks naming the step, and
/// gives their reservations back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn creates_are_retried_while_the_provisioner_is_away() {
    let (mut mesh, src, mut gw) = setup().await;
    let mut ledger = BudgetLedgerClient::new(mesh.channel("budget-ledger").await.unwrap());
    let provisioner = "sandbox-provisioner";

    mesh.terminate(provisioner, Duration::from_secs(30))
        .expect("the provisioner stops");
    let back = gw
        .launch_run(launch(src.path(), 2, 2, "echo x > f.txt"))
        .await
        .unwrap()
        .into_inner()
        .run_id;
    tokio::time::sleep(Duration::from_secs(2)).await;
    mesh.start_service(provisioner).unwrap();
    mesh.wait_serving(provisioner, Duration::from_secs(60))
        .await
        .unwrap();
    let run = wait_finished(&mut gw, &back, LONG).await;
    assert_eq!(run.forks_succeeded, 2, "{run:#?}");
    assert_eq!(run_account(&mut ledger, &back).await.reserved_micros, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_gives_up_once_the_provisioner_stays_away_for_minutes() {
    let (mut mesh, src, mut gw) = setup().await;
    let mut ledger = BudgetLedgerClient::new(mesh.channel("budget-ledger").await.unwrap());
    mesh.terminate("sandbox-provisioner", Duration::from_secs(30))
        .expect("the provisioner stops");
    let gone = gw
        .launch_run(launch(src.path(), 1, 1, "echo x > f.txt"))
        .await
        .unwrap()
        .into_inner()
        .run_id;
    let run = wait_finished(&mut gw, &gone, Duration::from_secs(260)).await;
    let fork = &run.forks[0];
    assert_eq!(status_of(&run, 1), ForkStatus::Failed, "{run:#?}");
    assert!(fork.error.starts_with("create sandbox: "), "{}", fork.error);
    // Seven tries, 5, 10, 20, 40, 60 and 60 s apart: an outage shorter than that only
    // delays the fork (e2e_outage).
    let took = fork.finished_unix_ms - fork.started_unix_ms;
    assert!(took >= 195_000, "gave up after {took} ms: {fork:#?}");
    let account = run_account(&mut ledger, &gone).await;
    assert_eq!(account.reserved_micros, 0, "{account:#?}");
    assert_eq!(account.spent_micros, 0, "{account:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verification_ranks_forks_names_a_winner_and_can_stop_early() {
    let (_mesh, src, mut gw) = setup().await;
    // Fork n costs (4 - n) cents; fork 1's work fails verification.
    let agent = r#"echo "$FORKYARD_FORK" > which.txt; printf '{"total_cost_usd": 0.0%d}\n' $((4 - FORKYARD_FORK))"#;
    let verify = r#"echo checking; [ "$(cat which.txt)" != 1 ]"#;
    let mut req = launch(src.path(), 3, 3, agent);
    req.verify_command = verify.into();
    let run_id = gw.launch_run(req).await.unwrap().into_inner().run_id;
    let run = wait_finished(&mut gw, &run_id, LONG).await;
    assert_eq!(run.forks_succeeded, 3, "{run:#?}");
    assert_eq!(run.ranking, vec![3, 2, 1], "verified first, then cheaper");
    assert_eq!(run.winner, 3);
    let one = fork_result(&mut gw, &run_id, 1).await;
    assert_eq!(one.verify, VerifyStatus::Failed as i32);
    assert_eq!(one.verify_exit_code, 1);
    assert!(one.verify_output_tail.contains("checking"), "{one:#?}");
    assert!(one.patch.contains("+1"), "{}", one.patch);
    assert_eq!(
        fork_result(&mut gw, &run_id, 3).await.verify,
        VerifyStatus::Passed as i32
    );

    // Stop on first verified: fork 2 verifies first (one at a time), 3 never starts.
    let mut req = launch(src.path(), 3, 1, agent);
    req.verify_command = verify.into();
    req.stop_on_first_verified = true;
    let first = gw
        .launch_run(LaunchRunRequest {
            prompt: "second".into(),
            ..req
        })
        .await
        .unwrap()
        .into_inner()
        .run_id;
    let run = wait_finished(&mut gw, &first, LONG).await;
    assert_eq!(status_of(&run, 1), ForkStatus::Succeeded, "{run:#?}");
    assert_eq!(status_of(&run, 2), ForkStatus::Succeeded);
    assert_eq!(status_of(&run, 3), ForkStatus::Cancelled);
    assert_eq!(run.winner, 2);

    // Bad fork numbers.
    let err = gw
        .get_fork_result(GetForkResultRequest {
            run_id: run_id.clone(),
            fork: 7,
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    let err = gw
        .get_fork_result(GetForkResultRequest {
            run_id: "run-nope".into(),
            fork: 1,
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_run_streams_fork_and_agent_progress_until_the_run_finishes() {
    let (_mesh, src, mut gw) = setup().await;
    let run_id = gw
        .launch_run(launch(src.path(), 2, 2, "sleep 4; echo ok > o.txt"))
        .await
        .unwrap()
        .into_inner()
        .run_id;
    let mut stream = gw
        .watch_run(WatchRunRequest {
            run_id: run_id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    let mut kinds: Vec<(Kind, u32)> = Vec::new();
    while let Some(e) = tokio::time::timeout(LONG, stream.message())
        .await
        .expect("events keep coming")
        .unwrap()
    {
        kinds.push((Kind::try_from(e.kind).unwrap(), e.fork));
        if e.kind == Kind::RunFinished as i32 {
            let run = e.run.expect("final run");
            assert_eq!(run.state, RunState::Completed as i32);
            break;
        }
    }
    assert_eq!(
        kinds.first().map(|k| k.0),
        Some(Kind::Snapshot),
        "{kinds:?}"
    );
    assert_eq!(
        kinds.last().map(|k| k.0),
        Some(Kind::RunFinished),
        "{kinds:?}"
    );
    for fork in [1, 2] {
        for kind in [
            Kind::ForkStarted,
            Kind::SandboxReady,
            Kind::AgentProgress,
            Kind::ForkFinished,
        ] {
            assert!(
                kinds.contains(&(kind, fork)),
                "no {kind:?} for fork {fork}: {kinds:?}"
            );
        }
        let pos = |k: Kind| kinds.iter().position(|x| *x == (k, fork)).unwrap();
        assert!(pos(Kind::ForkStarted) < pos(Kind::SandboxReady));
        assert!(pos(Kind::SandboxReady) < pos(Kind::ForkFinished));
    }
    let err = gw
        .watch_run(WatchRunRequest {
            run_id: "run-nope".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relaunching_with_another_request_and_the_cleanup_schedule() {
    let (_mesh, src, mut gw) = setup().await;
    let req = LaunchRunRequest {
        request_id: "same".into(),
        ..launch(src.path(), 1, 1, "true")
    };
    gw.launch_run(req.clone()).await.unwrap();
    let err = gw
        .launch_run(LaunchRunRequest { forks: 2, ..req })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::AlreadyExists, "{err:?}");
    assert!(err.message().starts_with("request_id"), "{}", err.message());

    let start = |interval_minutes, max_age_minutes| StartCleanupRequest {
        interval_minutes,
        max_age_minutes,
    };
    for (i, a) in [(0, 10), (100_000, 10), (15, 0), (15, 1_000_000)] {
        let err = gw.start_cleanup(start(i, a)).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "({i}, {a})");
    }
    let err = gw.stop_cleanup(StopCleanupRequest {}).await.unwrap_err();
    assert_eq!(err.code(), Code::NotFound, "{err:?}");
    assert!(
        gw.start_cleanup(start(15, 180))
            .await
            .unwrap()
            .into_inner()
            .created
    );
    assert!(
        !gw.start_cleanup(start(30, 60))
            .await
            .unwrap()
            .into_inner()
            .created,
        "second start updates"
    );
    gw.stop_cleanup(StopCleanupRequest {}).await.unwrap();
    assert_eq!(
        gw.stop_cleanup(StopCleanupRequest {})
            .await
            .unwrap_err()
            .code(),
        Code::NotFound
    );
}

/// The `forkyard` command against the mesh: its output and the exit codes scripts use.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_drives_runs_with_exit_codes_scripts_can_rely_on() {
    let (mesh, src, _gw) = setup().await;
    let gateway = mesh.endpoint("gateway");
    let cli = |args: &[&str]| {
        let out = std::process::Command::new(forkyard_tests::mesh::bin_dir().join("forkyard"))
            .arg("--gateway")
            .arg(&gateway)
            .args(args)
            .output()
            .expect("forkyard runs");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let repo = src.path().to_str().unwrap();
    let fork_args = |agent: &'static str| {
        vec![
            "fork",
            repo,
            "-p",
            "add a note",
            "-f",
            "2",
            "--max-concurrent",
            "2",
            "--budget",
            "1",
            "--agent-command",
            agent,
            "--wait",
            "-o",
            "json",
        ]
    };

    let (code, out, err) = cli(&fork_args("echo \"$FORKYARD_PROMPT\" > note.txt"));
    assert_eq!(code, Some(0), "{out}\n{err}");
    // The standard protobuf JSON mapping, as grpcurl prints it.
    let run: serde_json::Value = serde_json::from_str(&out).expect("json run");
    assert_eq!(run["state"], RunState::Completed.as_str_name(), "{out}");
    assert_eq!(run["forks"][0]["status"], "FORK_STATUS_SUCCEEDED", "{out}");
    let run_id = run["runId"].as_str().unwrap().to_owned();

    let patch_file = src.path().join("fork-1.patch");
    let (code, _, err) = cli(&[
        "result",
        &run_id,
        "1",
        "--save",
        patch_file.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        std::fs::read_to_string(&patch_file)
            .unwrap()
            .contains("+add a note")
    );

    let (code, out, _) = cli(&["status", &run_id]);
    assert_eq!(code, Some(0));
    assert!(
        out.contains("succeeded") && out.contains("forkyard-fork-2"),
        "{out}"
    );
    let (code, out, _) = cli(&["list", "-o", "json"]);
    assert_eq!(code, Some(0));
    let list: serde_json::Value = serde_json::from_str(&out).expect("json list");
    assert!(
        list["runs"]
            .as_array()
            .is_some_and(|runs| runs.iter().any(|r| r["runId"] == run_id.as_str())),
        "{out}"
    );
    // People read times, not unix milliseconds.
    let (code, out, _) = cli(&["list"]);
    assert_eq!(code, Some(0));
    assert!(out.contains(" ago)") && out.contains('T'), "{out}");

    let (code, _, _) = cli(&fork_args("[ \"$FORKYARD_FORK\" = 1 ] || exit 3"));
    assert_eq!(code, Some(2), "some fork failed");
    let (code, _, _) = cli(&fork_args("exit 3"));
    assert_eq!(code, Some(3), "every fork failed: the run failed");
    let (code, _, err) = cli(&["status", "run-nope"]);
    assert_eq!(code, Some(1));
    assert!(err.contains("not found"), "{err}");
    let (code, _, err) = cli(&[
        "fork",
        repo,
        "-p",
        "x",
        "--agent-command",
        "true",
        "-f",
        "0",
    ]);
    assert_eq!(code, Some(1), "refused by the gateway: {err}");
    assert!(err.contains("forks"), "{err}");
    let (code, _, _) = cli(&["fork", "--no-such-flag"]);
    assert_eq!(code, Some(64), "bad usage");
}
