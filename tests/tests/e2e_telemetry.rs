//! End to end: one trace per run across the mesh, metrics that match what happened, and
//! a collector that is down or misnamed never stopping a service.
//!
//! Spans go over OTLP/gRPC to `forkyard_tests::otlp::TraceSink`, which writes them to a
//! file that the test reads back (see that module for why not otelcol-contrib).

mod telemetry;

use forkyard_proto::{
    gateway::v1::{LaunchRunRequest, RunState, gateway_client::GatewayClient},
    janitor::v1::{SweepRequest, janitor_client::JanitorClient},
};
use forkyard_tests::{
    Mesh,
    mesh::MeshOptions,
    otlp::TraceSink,
    repo,
    support::{Gateway, launch, wait_finished},
};
use std::{
    collections::HashSet,
    path::Path,
    time::{Duration, Instant},
};
use telemetry::{
    metrics::assert_metrics_match,
    spans::{Trace, assert_sweep_spans_under_sweep_now, fork_span_name, run_spans_in, spans_once},
};

/// Fork n reports one model turn as Claude Code's stream-json prints it (charged to the
/// ledger while the agent runs), then a cost of n × 0.01 + 0.005 USD and 100 / 20 tokens.
const AGENT: &str = r#"echo "fork $FORKYARD_FORK" > "fork-$FORKYARD_FORK.txt"
echo '{"type":"assistant","message":{"id":"msg_1","model":"claude-sonnet-4-5","usage":{"input_tokens":100,"output_tokens":20}}}'
printf '{"type":"result","total_cost_usd":0.0%d5,"usage":{"input_tokens":100,"output_tokens":20}}\n' "$FORKYARD_FORK""#;

/// The caller's own span: the run's trace is the caller's trace.
const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER_SPAN: &str = "00f067aa0ba902b7";
const SWEEP_TRACE_ID: &str = "5cf92f3577b34da6a3ce929d0e0e4737";

fn otel_env(endpoint: &str) -> Vec<(String, String)> {
    vec![
        ("OTEL_EXPORTER_OTLP_ENDPOINT".into(), endpoint.into()),
        // Export within a fraction of a second instead of every 5 s.
        ("OTEL_BSP_SCHEDULE_DELAY".into(), "200".into()),
    ]
}

fn launch_with_trace(req: LaunchRunRequest) -> tonic::Request<LaunchRunRequest> {
    let mut req = tonic::Request::new(req);
    req.metadata_mut().insert(
        "traceparent",
        format!("00-{TRACE_ID}-{CALLER_SPAN}-01").parse().unwrap(),
    );
    req
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_is_one_trace_across_the_mesh_and_its_metrics_match() {
    one_trace_and_metrics(true).await;
}

/// The same with every fork in a child workflow of its own (a run above the gateway's
/// `--inline-fork-limit`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_of_fork_workflows_is_one_trace_too() {
    one_trace_and_metrics(false).await;
}

async fn one_trace_and_metrics(inline: bool) {
    let sink_dir = tempfile::tempdir().unwrap();
    let sink = TraceSink::start(&sink_dir.path().join("spans.jsonl"))
        .await
        .unwrap();
    let mesh = traced_mesh(&sink, inline).await;
    let src = tempfile::tempdir().unwrap();
    repo::create(src.path()).unwrap();
    let mut gw = Gateway::new(mesh.channel("gateway").await.unwrap());
    let run_id = launch_traced_and_a_bad_one(&mut gw, src.path()).await;
    let run = wait_finished(&mut gw, &run_id, Duration::from_secs(180)).await;
    assert_eq!(run.state, RunState::Completed as i32, "{run:#?}");
    assert_eq!(run.forks_succeeded, 2, "{run:#?}");

    let spans = spans_once(&sink, TRACE_ID, run_spans_in).await;
    let trace = Trace::new(&spans);
    trace.assert_run_services_take_part();
    let root = trace.assert_one_tree(CALLER_SPAN);
    for fork in 1..=2u32 {
        trace.assert_fork_traced(fork, inline, &run_id);
    }
    trace.assert_ledger_under_a_fork(fork_span_name(inline));
    trace.assert_servers_under_their_clients(root);
    assert_a_sweep_is_a_trace_of_its_own(&mesh, &sink).await;
    assert_metrics_match(&mesh);
}

/// A mesh whose every service exports its spans to `sink`; with `inline` false, every
/// fork runs in a child workflow.
async fn traced_mesh(sink: &TraceSink, inline: bool) -> Mesh {
    let mut env = otel_env(&sink.endpoint());
    if !inline {
        env.push(("FORKYARD_INLINE_FORK_LIMIT".into(), "0".into()));
    }
    Mesh::start_with(MeshOptions {
        env,
        ..Default::default()
    })
    .await
    .expect("mesh starts")
}

/// Two forks launched in the caller's trace, and a launch refused (counted under its
/// code): the run's id.
async fn launch_traced_and_a_bad_one(gw: &mut Gateway, src: &Path) -> String {
    let launched = gw
        .launch_run(launch_with_trace(LaunchRunRequest {
            request_id: "e2e-telemetry".into(),
            ..launch(src, 2, 2, AGENT)
        }))
        .await
        .expect("launch")
        .into_inner();
    let bad = gw
        .launch_run(LaunchRunRequest {
            request_id: "e2e-telemetry-bad".into(),
            ..launch(src, 0, 1, AGENT)
        })
        .await
        .expect_err("zero forks is refused");
    assert_eq!(bad.code(), tonic::Code::InvalidArgument);
    launched.run_id
}

/// The janitor, the fifth service, is no part of a run: its sweeps are traces of their
/// own, and they cross the mesh the same way (janitor → provisioner and ledger).
async fn assert_a_sweep_is_a_trace_of_its_own(mesh: &Mesh, sink: &TraceSink) {
    let mut janitor = JanitorClient::new(mesh.channel("janitor").await.unwrap());
    let mut sweep = tonic::Request::new(SweepRequest {
        dry_run: true,
        ..Default::default()
    });
    sweep.metadata_mut().insert(
        "traceparent",
        format!("00-{SWEEP_TRACE_ID}-{CALLER_SPAN}-01")
            .parse()
            .unwrap(),
    );
    janitor.sweep_now(sweep).await.expect("sweep");
    let sweep_spans = spans_once(sink, SWEEP_TRACE_ID, |spans| {
        let services: HashSet<String> = spans.iter().map(|s| s.service.clone()).collect();
        services.len() >= 3
    })
    .await;
    assert_sweep_spans_under_sweep_now(&sweep_spans);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_or_malformed_collector_never_stops_a_service() {
    // Nothing listens on this port: every export fails.
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead_endpoint = format!("http://{}", dead.local_addr().unwrap());
    drop(dead);
    let mut mesh = Mesh::start_with(MeshOptions {
        env: otel_env(&dead_endpoint),
        ..Default::default()
    })
    .await
    .expect("mesh starts with the collector down");
    let src = tempfile::tempdir().unwrap();
    repo::create(src.path()).unwrap();
    let mut gw = GatewayClient::new(mesh.channel("gateway").await.unwrap());
    let started = Instant::now();
    let launched = gw
        .launch_run(LaunchRunRequest {
            request_id: "e2e-dead-collector".into(),
            ..launch(src.path(), 1, 1, AGENT)
        })
        .await
        .expect("launch")
        .into_inner();
    let run = wait_finished(&mut gw, &launched.run_id, Duration::from_secs(120)).await;
    assert_eq!(run.state, RunState::Completed as i32, "{run:#?}");
    eprintln!("run with the collector down took {:?}", started.elapsed());
    // Once every service that took part in the run has failed an export (and said so):
    // one warning per service whose spans were dropped, not one per batch (the janitor
    // takes no part in a run: no spans).
    let logs = mesh.state_dir().join("logs");
    let full_log = |service: &str| {
        std::fs::read_to_string(logs.join(format!("{service}.log"))).unwrap_or_default()
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while forkyard_tests::mesh::SERVICES
        .iter()
        .filter(|s| **s != "janitor")
        .any(|s| !full_log(s).contains("spans are dropped"))
    {
        assert!(
            Instant::now() < deadline,
            "not every service warned of its dropped spans"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for service in forkyard_tests::mesh::SERVICES {
        let log = full_log(service);
        let warnings = log.matches("spans are dropped").count();
        let want = if service == "janitor" { 0..=1 } else { 1..=1 };
        assert!(
            want.contains(&warnings),
            "{service} warned {warnings} times:\n{log}"
        );
    }

    // A malformed endpoint: the service starts, serves, and says why once.
    mesh.set_env("OTEL_EXPORTER_OTLP_ENDPOINT", "not a url");
    mesh.terminate("budget-ledger", Duration::from_secs(20));
    mesh.start_service("budget-ledger").unwrap();
    mesh.wait_serving("budget-ledger", Duration::from_secs(60))
        .await
        .expect("budget-ledger serves with a malformed endpoint");
    let log = full_log("budget-ledger");
    // Once, naming the variable and what is wrong with it.
    let warned = log
        .lines()
        .filter(|l| {
            l.contains("settings unusable, spans are dropped")
                && l.contains("OTEL_EXPORTER_OTLP_ENDPOINT=not a url")
        })
        .count();
    assert_eq!(warned, 1, "{log}");
}
