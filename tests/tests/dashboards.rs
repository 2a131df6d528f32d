//! The Grafana dashboards in deploy/grafana/dashboards are importable JSON that query the
//! Prometheus data source the provisioning defines, and only name metrics the services
//! export (a renamed metric must not leave a dashboard silently empty).

use std::{collections::HashSet, path::Path};

/// The metric families the services register (services/common/src/metrics.rs,
/// grpc_telemetry.rs, activity_telemetry.rs, services/janitor/src/metrics.rs); `temporal_*`
/// are the SDK's.
const EXPORTED: &[&str] = &[
    "sandbox_fork_completed_total",
    "sandbox_fork_duration_seconds",
    "sandbox_fork_cost_usd",
    "sandbox_created_total",
    "sandbox_duration_seconds",
    "agent_cost_usd",
    "active_sandboxes",
    "grpc_server_requests_total",
    "grpc_server_request_duration_seconds",
    "grpc_client_requests_total",
    "grpc_client_request_duration_seconds",
    "janitor_sandboxes_reaped_total",
    "janitor_reservations_released_total",
    "janitor_sweeps_total",
    "activity_retries_total",
];

fn metric_names(expr: &str) -> Vec<String> {
    expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        // Label names that share a metric prefix.
        .filter(|w| *w != "activity_type")
        .filter(|w| {
            // Prometheus's own series for each scrape target.
            *w == "up"
                || [
                    "sandbox_",
                    "agent_",
                    "active_",
                    "activity_",
                    "grpc_",
                    "janitor_",
                    "temporal_",
                ]
                .iter()
                .any(|p| w.starts_with(p))
        })
        .map(|w| {
            let base = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| w.strip_suffix(s))
                .unwrap_or(w);
            base.to_owned()
        })
        .collect()
}

#[test]
fn dashboards_are_importable_and_query_exported_metrics() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let datasources =
        std::fs::read_to_string(root.join("deploy/grafana/provisioning/datasources/forkyard.yml"))
            .unwrap();
    assert!(datasources.contains("uid: prometheus"));
    let dir = root.join("deploy/grafana/dashboards");
    let mut uids = HashSet::new();
    let mut files = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().and_then(|e| e.to_str()) != Some("json") {
            continue;
        }
        files += 1;
        let name = path.display().to_string();
        let dash: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).expect(&name);
        assert!(
            uids.insert(dash["uid"].as_str().expect("uid").to_owned()),
            "{name}: uid reused"
        );
        assert!(
            dash["title"].as_str().is_some_and(|t| !t.is_empty()),
            "{name}"
        );
        let panels = dash["panels"].as_array().expect("panels");
        assert!(!panels.is_empty(), "{name}");
        let mut ids = HashSet::new();
        for panel in panels {
            let title = panel["title"].as_str().unwrap_or("?");
            assert!(
                ids.insert(panel["id"].as_i64().expect("panel id")),
                "{name}: {title}"
            );
            assert_eq!(panel["datasource"]["uid"], "prometheus", "{name}: {title}");
            assert!(panel["gridPos"]["w"].as_i64().is_some(), "{name}: {title}");
            let targets = panel["targets"].as_array().expect("targets");
            assert!(!targets.is_empty(), "{name}: {title}");
            for target in targets {
                let expr = target["expr"].as_str().expect("expr");
                let names = metric_names(expr);
                assert!(!names.is_empty(), "{name}: {title}: {expr}");
                for metric in names {
                    assert!(
                        metric.starts_with("temporal_") || EXPORTED.contains(&metric.as_str()),
                        "{name}: {title}: {metric} is not exported"
                    );
                }
            }
        }
    }
    assert!(files >= 3, "{files} dashboards in {}", dir.display());
}

/// The alerts of k8s/monitoring/prometheusrule.yaml name only exported metrics too (their
/// firing is tested by promtool: scripts/check-alerts.sh).
#[test]
fn alerts_query_exported_metrics() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let rules = std::fs::read_to_string(root.join("k8s/monitoring/prometheusrule.yaml")).unwrap();
    let exprs: Vec<&str> = rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("expr: "))
        .collect();
    assert!(exprs.len() >= 5, "{exprs:?}");
    // The SDK's own histograms, as the services export them (prefix `temporal_`,
    // durations in seconds with the unit suffix: forkyard_common::temporal).
    use temporalio_common::telemetry::metrics::{
        ACTIVITY_SCHED_TO_START_LATENCY_HISTOGRAM_NAME as ACTIVITY,
        WORKFLOW_TASK_SCHED_TO_START_LATENCY_HISTOGRAM_NAME as WORKFLOW_TASK,
    };
    let sdk = [ACTIVITY, WORKFLOW_TASK].map(|name| format!("temporal_{name}_seconds"));
    for expr in exprs {
        let names = metric_names(expr);
        assert!(!names.is_empty(), "{expr}");
        for metric in names {
            assert!(
                EXPORTED.contains(&metric.as_str()) || sdk.contains(&metric) || metric == "up",
                "{metric} in {expr} is not exported"
            );
        }
    }
}
