//! A namespace without the search attributes runs need, where the gateway may not add
//! them (Temporal Cloud; `FORKYARD_REGISTER_SEARCH_ATTRIBUTES=false`): the gateway stays
//! up NOT_SERVING, names the missing attributes and the commands that create them, and
//! serves as soon as they exist, without a restart.

use forkyard_proto::gateway::v1::{LaunchRunRequest, RunState, gateway_client::GatewayClient};
use forkyard_tests::{
    Mesh,
    mesh::temporal_cli,
    repo,
    support::{launch, wait_finished},
};
use std::time::{Duration, Instant};
use tonic_health::pb::{
    HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
};

const ATTRIBUTES: [(&str, &str); 4] = [
    ("ForkyardRunState", "Keyword"),
    ("ForkyardLabels", "KeywordList"),
    ("ForkyardTenant", "Keyword"),
    ("ForkyardForkSlots", "Int"),
];

fn temporal(mesh: &Mesh, args: &[&str]) {
    let out = std::process::Command::new(temporal_cli())
        .args(["operator", "search-attribute"])
        .args(args)
        .args([
            "--namespace",
            "default",
            "--address",
            &mesh.temporal_address(),
        ])
        .output()
        .expect("temporal CLI");
    assert!(out.status.success(), "temporal {args:?}: {out:?}");
}

async fn gateway_health(mesh: &Mesh) -> Option<i32> {
    let ch = mesh.channel("gateway").await.ok()?;
    HealthClient::new(ch)
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .ok()
        .map(|r| r.into_inner().status)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_that_may_not_add_search_attributes_waits_not_serving_for_them() {
    let mut mesh = Mesh::start().await.expect("mesh");
    // The namespace as Temporal Cloud hands it over: none of Forkyard's attributes.
    mesh.terminate("gateway", Duration::from_secs(20));
    for (name, _) in ATTRIBUTES {
        temporal(&mesh, &["remove", "--name", name, "--yes"]);
    }
    mesh.set_service_env(
        "gateway",
        "FORKYARD_REGISTER_SEARCH_ATTRIBUTES",
        Some("false"),
    );
    mesh.start_service("gateway").unwrap();

    // Up, NOT_SERVING, saying what is missing and how to create it.
    let deadline = Instant::now() + Duration::from_secs(60);
    while !mesh
        .log_tail("gateway")
        .contains("search attributes missing")
    {
        assert!(Instant::now() < deadline, "{}", mesh.log_tail("gateway"));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        gateway_health(&mesh).await,
        Some(ServingStatus::NotServing as i32)
    );
    let log = mesh.log_tail("gateway");
    for (name, ty) in ATTRIBUTES {
        assert!(log.contains(&format!("--name {name} --type {ty}")), "{log}");
        assert!(
            log.contains(&format!("--search-attribute {name}={ty}")),
            "{log}"
        );
    }
    // Calls meanwhile: UNAVAILABLE, saying why.
    let mut gw = GatewayClient::new(mesh.channel("gateway").await.unwrap());
    let src = tempfile::tempdir().unwrap();
    repo::create(src.path()).unwrap();
    let refused = gw
        .launch_run(launch(src.path(), 1, 1, "true"))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unavailable, "{refused:?}");
    assert!(
        refused.message().contains("search attributes"),
        "{refused:?}"
    );

    // Created by the operator: the gateway serves, without a restart, and runs work.
    for (name, ty) in ATTRIBUTES {
        temporal(&mesh, &["create", "--name", name, "--type", ty]);
    }
    mesh.wait_serving("gateway", Duration::from_secs(60))
        .await
        .expect("the gateway serves once the attributes exist");
    let mut gw = GatewayClient::new(mesh.channel("gateway").await.unwrap());
    let launched = gw
        .launch_run(LaunchRunRequest {
            request_id: "after-attributes".into(),
            ..launch(src.path(), 1, 1, "echo ok > f.txt")
        })
        .await
        .expect("launch")
        .into_inner();
    let run = wait_finished(&mut gw, &launched.run_id, Duration::from_secs(120)).await;
    assert_eq!(run.state, RunState::Completed as i32, "{run:#?}");
}
