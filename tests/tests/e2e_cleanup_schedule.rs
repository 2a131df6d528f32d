//! A fresh deployment sweeps orphans without anyone asking: the gateway creates the
//! janitor's schedule at start (`FORKYARD_CLEANUP_INTERVAL_MINUTES`), it sweeps, and
//! `StopCleanup` stops it for good: a gateway restart neither makes it anew nor resumes it.

use forkyard_proto::gateway::v1::{StopCleanupRequest, gateway_client::GatewayClient};
use forkyard_tests::{
    Mesh,
    mesh::{MeshOptions, temporal_cli},
    otlp::sample,
};
use std::time::{Duration, Instant};

/// The schedule as `temporal schedule describe` prints it (JSON).
fn describe(mesh: &Mesh) -> serde_json::Value {
    let out = std::process::Command::new(temporal_cli())
        .args(["schedule", "describe", "--schedule-id", "forkyard-cleanup"])
        .args(["--address", &mesh.temporal_address(), "-o", "json"])
        .output()
        .expect("temporal CLI");
    assert!(out.status.success(), "describe: {out:?}");
    serde_json::from_slice(&out.stdout).expect("json")
}

fn paused(schedule: &serde_json::Value) -> bool {
    schedule["schedule"]["state"]["paused"].as_bool() == Some(true)
}

fn sweeps(mesh: &Mesh) -> f64 {
    sample(
        &mesh.scrape("janitor").unwrap_or_default(),
        "janitor_sweeps_total",
        &[],
    )
    .unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_cleanup_schedule_sweeps_and_stop_cleanup_outlives_a_gateway_restart() {
    let mut mesh = Mesh::start_with(MeshOptions {
        env: vec![
            ("FORKYARD_CLEANUP_INTERVAL_MINUTES".into(), "1".into()),
            ("FORKYARD_CLEANUP_MAX_AGE_MINUTES".into(), "120".into()),
        ],
        ..Default::default()
    })
    .await
    .expect("mesh");
    let schedule = describe(&mesh);
    assert!(!paused(&schedule), "{schedule:#}");
    let spec = schedule["schedule"]["spec"].to_string();
    assert!(spec.contains("60s"), "every minute: {spec}");

    // It sweeps on its own within a minute (the next minute's tick).
    let deadline = Instant::now() + Duration::from_secs(90);
    while sweeps(&mesh) < 1.0 {
        assert!(Instant::now() < deadline, "no scheduled sweep in 90 s");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    // Stopped: paused with a note that says how to resume.
    let mut gw = GatewayClient::new(mesh.channel("gateway").await.unwrap());
    gw.stop_cleanup(StopCleanupRequest {}).await.unwrap();
    let schedule = describe(&mesh);
    assert!(paused(&schedule), "{schedule:#}");
    assert!(
        schedule.to_string().contains("StartCleanup resumes it"),
        "{schedule:#}"
    );

    // A gateway start leaves the stopped schedule stopped.
    mesh.terminate("gateway", Duration::from_secs(20));
    mesh.start_service("gateway").unwrap();
    mesh.wait_serving("gateway", Duration::from_secs(60))
        .await
        .expect("gateway serves again");
    assert!(
        paused(&describe(&mesh)),
        "a gateway start resumed the stopped schedule"
    );
}
