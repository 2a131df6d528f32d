//! Each service's own /metrics after the telemetry test's run of two forks (one bad
//! launch beside it): counts, costs and durations that match what happened.

use forkyard_tests::{Mesh, otlp::sample};

/// Metrics, from each service's own /metrics.
pub fn assert_metrics_match(mesh: &Mesh) {
    let page = |s: &str| mesh.scrape(s).unwrap();
    assert_gateway_metrics(&page("gateway"));
    assert_provisioner_metrics(&page("sandbox-provisioner"));
    assert_runner_metrics(&page("agent-runner"));
    // Every service's page has its gRPC metrics (the mesh's health probes at least), the
    // run gauge, and its Temporal worker's metrics.
    for service in forkyard_tests::mesh::SERVICES {
        let p = page(service);
        for family in [
            "# TYPE grpc_server_requests_total ",
            "# TYPE active_sandboxes ",
            "# TYPE temporal_worker_task_slots_available ",
        ] {
            assert!(p.contains(family), "{service} lacks {family}");
        }
    }
}

/// Two forks succeeded and what they cost; one launch accepted, one refused.
fn assert_gateway_metrics(gateway: &str) {
    assert_eq!(
        sample(
            gateway,
            "sandbox_fork_completed_total",
            &[("status", "succeeded"), ("model", "none")]
        ),
        Some(2.0),
        "{gateway}"
    );
    assert_eq!(
        sample(
            gateway,
            "sandbox_fork_duration_seconds_count",
            &[("status", "succeeded")]
        ),
        Some(2.0)
    );
    let fork_cost = sample(gateway, "sandbox_fork_cost_usd_sum", &[("model", "none")]).unwrap();
    assert!((fork_cost - 0.04).abs() < 1e-9, "fork cost sum {fork_cost}");
    let launches = |code| {
        sample(
            gateway,
            "grpc_server_requests_total",
            &[
                ("method", "forkyard.gateway.v1.Gateway/LaunchRun"),
                ("code", code),
            ],
        )
    };
    assert_eq!(launches("OK"), Some(1.0));
    assert_eq!(launches("INVALID_ARGUMENT"), Some(1.0));
    assert!(
        gateway.contains("grpc_server_request_duration_seconds_bucket{code=\"OK\",method=\"forkyard.gateway.v1.Gateway/LaunchRun\""),
        "{gateway}"
    );
}

/// Two sandboxes made, both gone.
fn assert_provisioner_metrics(prov: &str) {
    assert_eq!(
        sample(
            prov,
            "sandbox_created_total",
            &[("template", "local"), ("status", "ok")]
        ),
        Some(2.0),
        "{prov}"
    );
    assert_eq!(sample(prov, "active_sandboxes", &[]), Some(0.0));
    assert_eq!(
        sample(prov, "sandbox_duration_seconds_count", &[]),
        Some(2.0)
    );
}

/// Two agents and what they cost, and the Temporal SDK's worker metrics on the same page.
fn assert_runner_metrics(agent: &str) {
    assert_eq!(
        sample(agent, "agent_cost_usd_count", &[("model", "none")]),
        Some(2.0)
    );
    let agent_cost = sample(agent, "agent_cost_usd_sum", &[("model", "none")]).unwrap();
    assert!(
        (agent_cost - 0.04).abs() < 1e-9,
        "agent cost sum {agent_cost}"
    );
    assert!(
        sample(
            agent,
            "temporal_activity_execution_latency_seconds_count",
            &[("activity_type", "agent.run")]
        ) >= Some(2.0),
        "{agent}"
    );
}
