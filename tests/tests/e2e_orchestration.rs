//! End to end, the run API beyond launch: pause and resume, cancelling single forks,
//! verification with ranking and early stop, WatchRun's events, ListRuns' filters,
//! GetForkResult, and the cleanup schedule. A spent budget: e2e_budget; creates while
//! the provisioner is away: e2e_outage; the CLI: e2e_cli.

use forkyard_proto::{
    common::v1::{ForkStatus, VerifyStatus},
    gateway::v1::{
        CancelForkRequest, GetForkResultRequest, LaunchRunRequest, ListRunsRequest,
        ListRunsResponse, PauseRunRequest, ResumeRunRequest, RunState, StartCleanupRequest,
        StopCleanupRequest, WatchRunRequest, run_event::Kind,
    },
};
use forkyard_tests::{
    fixture::{LONG, setup, status_of},
    support::{
        Gateway, fork_result, get_run, launch, sandbox_processes, wait_finished, wait_until,
        workspaces_left,
    },
};
use std::{collections::HashMap, time::Duration};
use tonic::Code;

/// ListRuns filters by the live state and by labels: a paused run labelled team=infra
/// is found by both, and by nothing else.
async fn assert_list_runs_filters(gw: &mut Gateway, run_id: &str) {
    let listed = |state: RunState, labels: &[(&str, &str)]| ListRunsRequest {
        state: state as i32,
        labels: labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
        ..Default::default()
    };
    let ids = |resp: ListRunsResponse| resp.runs.into_iter().map(|r| r.run_id).collect::<Vec<_>>();
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
    assert_eq!(found, vec![run_id.to_owned()]);
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

    assert_list_runs_filters(&mut gw, &run_id).await;

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
    assert!(workspaces_left(mesh.state_dir()).is_empty());
    assert!(sandbox_processes(mesh.state_dir()).is_empty());

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
    // Stopping pauses the schedule (kept, so no gateway start makes it anew): stopping
    // again is no error, and a start resumes it.
    gw.stop_cleanup(StopCleanupRequest {}).await.unwrap();
    gw.stop_cleanup(StopCleanupRequest {}).await.unwrap();
    assert!(
        !gw.start_cleanup(start(15, 180))
            .await
            .unwrap()
            .into_inner()
            .created,
        "a start after a stop resumes the one schedule"
    );
}
