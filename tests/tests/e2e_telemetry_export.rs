//! End to end: the services export spans the way operators run collectors, configured by
//! the standard `OTEL_EXPORTER_OTLP_*` variables: OTLP/gRPC over mutual TLS with an
//! authorization header, and OTLP/HTTP with protobuf bodies.

use forkyard_proto::gateway::v1::{LaunchRunRequest, RunState, gateway_client::GatewayClient};
use forkyard_tests::{
    Mesh,
    mesh::MeshOptions,
    otlp::{Receive, TraceSink},
    repo,
    support::{launch, wait_finished},
};
use std::{
    collections::HashSet,
    path::Path,
    time::{Duration, Instant},
};

const HEADER: &str = "Bearer collector-t0ken";

/// Runs one one-fork run to its end.
async fn one_run(mesh: &Mesh, src: &Path, request_id: &str) {
    let mut gw = GatewayClient::new(mesh.channel("gateway").await.unwrap());
    let launched = gw
        .launch_run(LaunchRunRequest {
            request_id: request_id.into(),
            ..launch(src, 1, 1, "echo changed > f.txt")
        })
        .await
        .expect("launch")
        .into_inner();
    let run = wait_finished(&mut gw, &launched.run_id, Duration::from_secs(120)).await;
    assert_eq!(run.state, RunState::Completed as i32, "{run:#?}");
}

/// The services whose spans `sink` holds once all of `want` are among them, or after 30 s.
async fn services_seen(sink: &TraceSink, want: &[&str]) -> HashSet<String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let seen: HashSet<String> = sink.spans().into_iter().map(|s| s.service).collect();
        if want.iter().all(|w| seen.contains(*w)) || Instant::now() > deadline {
            return seen;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

fn assert_every_export_authorized(sink: &TraceSink) {
    let auth = sink.auth_headers();
    assert!(!auth.is_empty(), "no export reached the sink");
    assert!(
        auth.iter().all(|a| a == HEADER),
        "an export without the configured header: {auth:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_reach_collectors_over_grpc_with_mtls_and_over_http_protobuf_with_headers() {
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    let made = std::process::Command::new(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/certs.sh"),
    )
    .arg(&certs)
    .output()
    .unwrap();
    assert!(made.status.success(), "certs.sh: {made:?}");
    let tls_sink = TraceSink::start_receiving(
        &dir.path().join("grpc.jsonl"),
        Receive::GrpcMtls { certs: &certs },
    )
    .await
    .unwrap();
    let cert = |name: &str| certs.join(name).display().to_string();
    let env = [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", tls_sink.endpoint()),
        (
            "OTEL_EXPORTER_OTLP_HEADERS",
            "authorization=Bearer%20collector-t0ken".into(),
        ),
        ("OTEL_EXPORTER_OTLP_CERTIFICATE", cert("ca.pem")),
        ("OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE", cert("client.pem")),
        ("OTEL_EXPORTER_OTLP_CLIENT_KEY", cert("client.key")),
        ("OTEL_BSP_SCHEDULE_DELAY", "200".into()),
    ];
    let mut mesh = Mesh::start_with(MeshOptions {
        env: env.iter().map(|(k, v)| ((*k).into(), v.clone())).collect(),
        ..Default::default()
    })
    .await
    .expect("mesh starts");
    let src = tempfile::tempdir().unwrap();
    repo::create(src.path()).unwrap();

    one_run(&mesh, src.path(), "export-grpc-mtls").await;
    let want = [
        "gateway",
        "sandbox-provisioner",
        "agent-runner",
        "budget-ledger",
    ];
    let seen = services_seen(&tls_sink, &want).await;
    assert!(
        want.iter().all(|w| seen.contains(*w)),
        "over mTLS: {seen:?}"
    );
    assert_every_export_authorized(&tls_sink);

    // The ledger switched to OTLP/HTTP (the general endpoint gets /v1/traces).
    let http_sink =
        TraceSink::start_receiving(&dir.path().join("http.jsonl"), Receive::HttpProtobuf)
            .await
            .unwrap();
    mesh.set_env("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf");
    mesh.set_env("OTEL_EXPORTER_OTLP_ENDPOINT", &http_sink.endpoint());
    mesh.terminate("budget-ledger", Duration::from_secs(20));
    mesh.start_service("budget-ledger").unwrap();
    mesh.wait_serving("budget-ledger", Duration::from_secs(60))
        .await
        .expect("budget-ledger serves");
    one_run(&mesh, src.path(), "export-http").await;
    let seen = services_seen(&http_sink, &["budget-ledger"]).await;
    assert_eq!(
        seen,
        HashSet::from(["budget-ledger".to_owned()]),
        "over HTTP"
    );
    let calls = http_sink
        .spans()
        .iter()
        .filter(|s| s.name.starts_with("forkyard.budget.v1.BudgetLedger/"))
        .count();
    assert!(calls >= 1, "the ledger's calls came over HTTP");
    assert_every_export_authorized(&http_sink);
}
