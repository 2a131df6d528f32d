//! Fork trees (#45) as a tenant sees them: a watch opened at launch streams the
//! branches' events (each started and finished, with its parent and depth) through the
//! run's branch window to its end, and branches are forks like the others for the
//! tenant's concurrent-forks limit: they run within the run's slots, which the tenant's
//! other launches count while the run is open. Another tenant cannot branch the run.

#[allow(dead_code)]
mod tenant_calls;

use forkyard_proto::{
    common::v1::{ForkResult, ForkStatus},
    gateway::v1::{
        BranchForkRequest, LaunchRunRequest, Run, RunEvent, RunState, WatchRunRequest,
        run_event::Kind,
    },
};
use forkyard_tests::{Mesh, mesh::MeshOptions, repo, support::launch};
use std::time::{Duration, Instant};
use tenant_calls::{Gw, get, launch_req, new_key, wait_closed, with_key};
use tonic::{Code, Request};

/// The run's own forks finish at once; a branch takes a while, so branches overlap when
/// the run lets them.
const AGENT: &str = r#"if [ -n "$FORKYARD_PARENT_FORK" ]; then sleep 3; fi
echo "fork $FORKYARD_FORK" > "fork-$FORKYARD_FORK.txt""#;

/// Each tenant may run two forks at once.
async fn tenant_mesh() -> Mesh {
    Mesh::start_with(MeshOptions {
        api_keys: true,
        env: vec![("FORKYARD_TENANT_MAX_CONCURRENT_FORKS".into(), "2".into())],
        ..Default::default()
    })
    .await
    .expect("mesh starts")
}

/// Every event of the run's watch, to its end (or the stream's).
fn watch_all(gw: &Gw, key: &str, run_id: &str) -> tokio::task::JoinHandle<Vec<RunEvent>> {
    let mut gw = gw.clone();
    // No deadline: the watch lasts as long as the run.
    let mut req = Request::new(WatchRunRequest {
        run_id: run_id.into(),
    });
    req.metadata_mut()
        .insert("authorization", format!("Bearer {key}").parse().unwrap());
    tokio::spawn(async move {
        let mut stream = gw.watch_run(req).await.expect("watch").into_inner();
        let mut events = Vec::new();
        while let Ok(Some(e)) = stream.message().await {
            let last = e.kind == Kind::RunFinished as i32;
            events.push(e);
            if last {
                break;
            }
        }
        events
    })
}

async fn wait_for(gw: &mut Gw, key: &str, run_id: &str, done: impl Fn(&Run) -> bool) -> Run {
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        let run = get(gw, key, run_id).await.expect("own run");
        if done(&run) {
            return run;
        }
        assert!(Instant::now() < deadline, "never got there: {run:#?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_streams_the_branches_and_they_run_within_the_tenants_slots() {
    let mesh = tenant_mesh().await;
    let (_, key) = new_key(&mesh, "team-a");
    let (_, other) = new_key(&mesh, "team-b");
    let src = tempfile::tempdir().unwrap();
    repo::create(src.path()).unwrap();
    let mut gw: Gw = forkyard_proto::gateway::v1::gateway_client::GatewayClient::new(
        mesh.channel("gateway").await.unwrap(),
    );
    let req = LaunchRunRequest {
        branch_window_secs: 15,
        fork_budget_usd: "0.1".into(),
        ..launch(src.path(), 2, 2, AGENT)
    };
    let run_id = gw
        .launch_run(with_key(&key, req))
        .await
        .expect("launch")
        .into_inner()
        .run_id;
    let watch = watch_all(&gw, &key, &run_id);
    wait_for(&mut gw, &key, &run_id, |r| r.branchable_until_unix_ms > 0).await;

    let branch = |k: &str| {
        with_key(
            k,
            BranchForkRequest {
                run_id: run_id.clone(),
                fork: 1,
                count: 3,
                prompt: "again".into(),
            },
        )
    };
    let e = gw.branch_fork(branch(&other)).await.unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "another tenant branched: {e:?}");
    let made = gw.branch_fork(branch(&key)).await.expect("branch");
    assert_eq!(made.into_inner().forks, vec![3, 4, 5]);
    // The run holds both of the tenant's slots while its branches run.
    let e = gw
        .launch_run(with_key(&key, launch_req(src.path(), "more", "true")))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
    assert!(e.message().starts_with("max_concurrent"), "{e:?}");

    let run = wait_closed(&mut gw, &key, &run_id, Duration::from_secs(180)).await;
    assert_eq!(run.state, RunState::Completed as i32, "{run:#?}");
    assert_eq!(most_at_once(&run.forks), 2, "{:#?}", run.forks);
    let events = tokio::time::timeout(Duration::from_secs(30), watch)
        .await
        .expect("the watch ended with the run")
        .unwrap();
    assert_branches_watched(&events);
}

/// The most forks that ran at the same time (from start to finish).
fn most_at_once(forks: &[ForkResult]) -> usize {
    forks
        .iter()
        .map(|f| {
            forks
                .iter()
                .filter(|g| {
                    g.started_unix_ms <= f.started_unix_ms && f.started_unix_ms < g.finished_unix_ms
                })
                .count()
        })
        .max()
        .unwrap_or(0)
}

/// Each branch started and finished in the watch, named with its parent and depth, and
/// the watch ended with the run, all five forks in it.
fn assert_branches_watched(events: &[RunEvent]) {
    for fork in 3..=5 {
        let of = |kind: Kind| {
            events
                .iter()
                .find(|e| e.kind == kind as i32 && e.fork == fork)
                .and_then(|e| e.fork_result.clone())
        };
        let started = of(Kind::ForkStarted)
            .unwrap_or_else(|| panic!("fork {fork} never started: {events:#?}"));
        assert_eq!((started.parent_fork, started.depth), (1, 1), "fork {fork}");
        let finished = of(Kind::ForkFinished)
            .unwrap_or_else(|| panic!("fork {fork} never finished: {events:#?}"));
        assert_eq!(
            finished.status,
            ForkStatus::Succeeded as i32,
            "fork {fork}: {finished:#?}"
        );
        assert_eq!(
            (finished.parent_fork, finished.depth),
            (1, 1),
            "fork {fork}"
        );
    }
    let last = events.last().expect("events");
    assert_eq!(last.kind, Kind::RunFinished as i32, "{last:#?}");
    assert_eq!(
        last.run.as_ref().map(|r| r.forks.len()),
        Some(5),
        "{last:#?}"
    );
}
