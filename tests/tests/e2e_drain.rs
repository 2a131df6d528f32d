//! SIGTERM of the only provisioner with a run in flight. It drains: new creates are
//! refused, the forks on its sandboxes run to their end. Fork 1 ends first, and the
//! next wave (fork 3) is refused by the draining replica; fork 2 ends later. Fork 2's
//! finish must not wait behind the wave's retries (the replica waits for fork 2 to drain,
//! and the wave waited for the replica: each for the other, 197 s, then fork 3 failed
//! with "this replica is shutting down"), and fork 3's create waits for the restarted
//! replica without failing. So the drain ends once fork 2 is done, the provisioner
//! exits 0 well inside its grace period, and every fork succeeds.

use forkyard_proto::{
    common::v1::ForkStatus,
    gateway::v1::{LaunchRunRequest, RunState},
};
use forkyard_tests::{
    Mesh, repo,
    support::{Gateway, launch, wait_finished, wait_until},
};
use std::time::{Duration, Instant};

const AGENT: &str = r#"if [ "$FORKYARD_FORK" = 2 ]; then sleep 12; else sleep 2; fi
echo "fork $FORKYARD_FORK" > done.txt; printf '{"total_cost_usd": 0.001}\n'"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_draining_provisioner_never_blocks_a_run_nor_fails_a_fork() {
    let mut mesh = Mesh::start().await.expect("mesh starts");
    let src = tempfile::tempdir().unwrap();
    repo::create(src.path()).unwrap();
    let mut gw = Gateway::new(mesh.channel("gateway").await.unwrap());
    let run_id = gw
        .launch_run(LaunchRunRequest {
            request_id: "drain".into(),
            ..launch(src.path(), 3, 2, AGENT)
        })
        .await
        .unwrap()
        .into_inner()
        .run_id;
    wait_until(&mut gw, &run_id, Duration::from_secs(120), |r| {
        r.forks
            .iter()
            .filter(|f| f.phase == "running agent")
            .count()
            == 2
    })
    .await;

    let sigterm = Instant::now();
    let exited = tokio::task::block_in_place(|| {
        mesh.terminate("sandbox-provisioner", Duration::from_secs(120))
    });
    // Within its grace period (`terminationGracePeriodSeconds` 330, drain timeout 300);
    // the old wait of each for the other took 197 s.
    assert!(
        exited.is_some_and(|s| s.success()),
        "the drain did not end in 120 s: {exited:?}"
    );
    eprintln!("provisioner drained and exited in {:?}", sigterm.elapsed());
    mesh.start_service("sandbox-provisioner").unwrap();
    mesh.wait_serving("sandbox-provisioner", Duration::from_secs(60))
        .await
        .unwrap();

    let run = wait_finished(&mut gw, &run_id, Duration::from_secs(240)).await;
    assert_eq!(run.state, RunState::Completed as i32, "{run:#?}");
    for f in &run.forks {
        assert_eq!(f.status, ForkStatus::Succeeded as i32, "{f:#?}");
    }
    // The case happened: fork 3's create was refused by the draining replica.
    let log = std::fs::read_to_string(mesh.state_dir().join("logs/gateway.log")).unwrap();
    assert!(
        log.contains("this replica is shutting down"),
        "no create met the draining replica; the test proved nothing"
    );
}
