//! A service started while Temporal is down stays up: its port answers health
//! NOT_SERVING and its API UNAVAILABLE, it retries with backoff for as long as it takes,
//! and it serves once Temporal is back.

use forkyard_proto::gateway::v1::{GetRunRequest, gateway_client::GatewayClient};
use forkyard_tests::{
    Mesh, repo,
    support::{launch, wait_finished},
};
use std::time::Duration;
use tonic::Code;
use tonic_health::pb::{
    HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
};

async fn health(mesh: &Mesh, service: &str) -> Option<i32> {
    health_of(mesh, service, "").await
}

async fn health_of(mesh: &Mesh, service: &str, name: &str) -> Option<i32> {
    let ch = mesh.channel(service).await.ok()?;
    HealthClient::new(ch)
        .check(HealthCheckRequest {
            service: name.into(),
        })
        .await
        .ok()
        .map(|r| r.into_inner().status)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn services_started_without_temporal_wait_not_serving_and_serve_once_it_is_up() {
    let mut mesh = Mesh::start().await.expect("mesh");
    // The logs are appended to across restarts: only the retries after this count.
    let retries = |mesh: &Mesh, service: &str| {
        let log = mesh.state_dir().join("logs").join(format!("{service}.log"));
        std::fs::read_to_string(log)
            .unwrap_or_default()
            .matches("temporal not reachable: not serving yet, retrying")
            .count()
    };
    let before: Vec<usize> = ["gateway", "sandbox-provisioner"]
        .iter()
        .map(|s| retries(&mesh, s))
        .collect();
    mesh.kill9("temporal");
    for service in ["gateway", "sandbox-provisioner"] {
        mesh.kill9(service);
        mesh.start_service(service).unwrap();
    }
    // Each has tried Temporal three times, backing off between (0.5 s, then 1 s): up
    // through its retries, not a crash loop; then answering, not serving.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while ["gateway", "sandbox-provisioner"]
        .iter()
        .zip(&before)
        .any(|(s, before)| retries(&mesh, s) < before + 3)
    {
        assert!(
            std::time::Instant::now() < deadline,
            "no third try at Temporal: gateway {}, provisioner {}",
            mesh.log_tail("gateway"),
            mesh.log_tail("sandbox-provisioner")
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for service in ["gateway", "sandbox-provisioner"] {
        assert_eq!(
            health(&mesh, service).await,
            Some(ServingStatus::NotServing as i32),
            "{service}: {}",
            mesh.log_tail(service)
        );
        assert!(
            mesh.log_tail(service).contains("TEMPORAL_ADDRESS"),
            "{service} does not say what it waits for"
        );
        // Alive all the same: liveness and startup probes ask this, and do not restart it.
        assert_eq!(
            health_of(&mesh, service, "forkyard.liveness").await,
            Some(ServingStatus::Serving as i32),
            "{service}"
        );
    }
    let mut gw = GatewayClient::new(mesh.channel("gateway").await.unwrap());
    let err = gw
        .get_run(GetRunRequest {
            run_id: "run-x".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err:?}");

    // Temporal back (its database as it was): both serve, and a run goes through.
    mesh.start_temporal("temporal.db").unwrap();
    for service in ["gateway", "sandbox-provisioner"] {
        mesh.wait_serving(service, Duration::from_secs(60))
            .await
            .expect("serving once temporal is up");
    }
    let src = tempfile::tempdir().unwrap();
    repo::create(src.path()).unwrap();
    let mut gw = GatewayClient::new(mesh.channel("gateway").await.unwrap());
    let run_id = gw
        .launch_run(launch(src.path(), 1, 1, "echo back >> README.md"))
        .await
        .unwrap()
        .into_inner()
        .run_id;
    let run = wait_finished(&mut gw, &run_id, Duration::from_secs(90)).await;
    assert_eq!(run.forks_succeeded, 1, "{run:#?}");
}

/// A gateway given a provisioner name that does not resolve stays up NOT_SERVING (alive
/// for the liveness probe), names the setting in its log, and keeps looking it up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_name_that_does_not_resolve_keeps_the_service_not_serving_but_alive() {
    let mut mesh = Mesh::start().await.expect("mesh");
    mesh.set_env(
        "FORKYARD_PROVISIONER_ADDR",
        "http://no-such-provisioner.invalid:50052",
    );
    mesh.set_env("FORKYARD_DISCOVERY_REFRESH_SECS", "1");
    mesh.terminate("gateway", Duration::from_secs(30));
    mesh.start_service("gateway").unwrap();
    // Temporal is up: only the peer keeps it from serving. The name is in the log once
    // its first lookup has failed (the resolver may take its time to say so); from then
    // on the gateway is up, alive and not serving.
    let names_both = |log: &str| {
        log.contains("FORKYARD_PROVISIONER_ADDR") && log.contains("no-such-provisioner.invalid")
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !names_both(&mesh.log_tail("gateway")) && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let log = mesh.log_tail("gateway");
    assert!(
        names_both(&log),
        "the log does not name the setting and the name: {log}"
    );
    assert_eq!(
        health_of(&mesh, "gateway", "forkyard.liveness").await,
        Some(ServingStatus::Serving as i32)
    );
    assert_eq!(
        health(&mesh, "gateway").await,
        Some(ServingStatus::NotServing as i32),
        "not serving: {log}"
    );
}
