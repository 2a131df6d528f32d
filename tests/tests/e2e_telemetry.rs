//! End to end: one trace per run across the mesh, metrics that match what happened, and
//! a collector that is down or misnamed never stopping a service.
//!
//! Spans go over OTLP/gRPC to `forkyard_tests::otlp::TraceSink`, which writes them to a
//! file that the test reads back (see that module for why not otelcol-contrib).

use forkyard_proto::{
    gateway::v1::{LaunchRunRequest, RunState, gateway_client::GatewayClient},
    janitor::v1::{SweepRequest, janitor_client::JanitorClient},
};
use forkyard_tests::{
    Mesh,
    mesh::MeshOptions,
    otlp::{SpanRecord, TraceSink, sample},
    repo,
    support::{launch, wait_finished},
};
use std::{
    collections::{HashMap, HashSet},
    time::{Duration, Instant},
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

/// The chain of span names from `span` up to the trace's root.
fn ancestry<'a>(span: &'a SpanRecord, by_id: &HashMap<&str, &'a SpanRecord>) -> Vec<&'a str> {
    let mut chain = vec![span.name.as_str()];
    let mut cur = span;
    while let Some(parent) = by_id.get(cur.parent_span_id.as_str()) {
        chain.push(parent.name.as_str());
        cur = parent;
    }
    chain
}

/// Whether `ancestor` is on `span`'s parent chain.
fn descends_from(
    span: &SpanRecord,
    ancestor: &SpanRecord,
    by_id: &HashMap<&str, &SpanRecord>,
) -> bool {
    let mut cur = span;
    while let Some(parent) = by_id.get(cur.parent_span_id.as_str()) {
        if parent.span_id == ancestor.span_id {
            return true;
        }
        cur = parent;
    }
    false
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
    let mut env = otel_env(&sink.endpoint());
    if !inline {
        env.push(("FORKYARD_INLINE_FORK_LIMIT".into(), "0".into()));
    }
    let mesh = Mesh::start_with(MeshOptions {
        env,
        ..Default::default()
    })
    .await
    .expect("mesh starts");
    let src = tempfile::tempdir().unwrap();
    repo::create(src.path()).unwrap();
    let mut gw = GatewayClient::new(mesh.channel("gateway").await.unwrap());

    let launched = gw
        .launch_run(launch_with_trace(LaunchRunRequest {
            request_id: "e2e-telemetry".into(),
            ..launch(src.path(), 2, 2, AGENT)
        }))
        .await
        .expect("launch")
        .into_inner();
    // A bad launch is counted under its code.
    let bad = gw
        .launch_run(LaunchRunRequest {
            request_id: "e2e-telemetry-bad".into(),
            ..launch(src.path(), 0, 1, AGENT)
        })
        .await
        .expect_err("zero forks is refused");
    assert_eq!(bad.code(), tonic::Code::InvalidArgument);
    let run = wait_finished(&mut gw, &launched.run_id, Duration::from_secs(180)).await;
    assert_eq!(run.state, RunState::Completed as i32, "{run:#?}");
    assert_eq!(run.forks_succeeded, 2, "{run:#?}");

    // Spans arrive in batches; wait until both forks' agent and destroy spans are in.
    let deadline = Instant::now() + Duration::from_secs(30);
    let spans = loop {
        let spans: Vec<SpanRecord> = sink
            .spans()
            .into_iter()
            .filter(|s| s.trace_id == TRACE_ID)
            .collect();
        let count = |name: &str| spans.iter().filter(|s| s.name == name).count();
        let done = count("RunActivity:agent.run") >= 2
            && count("forkyard.budget.v1.BudgetLedger/Charge") >= 4
            && count("git.patch") >= 2
            && count("forkyard.sandbox.v1.SandboxProvisioner/DestroySandbox") >= 4
            && count("RunWorkflow:SandboxOrchestrationWorkflow") >= 1;
        if done || Instant::now() > deadline {
            break spans;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let dump = || {
        spans
            .iter()
            .map(|s| {
                format!(
                    "{} {} {} <- {}",
                    s.service, s.name, s.span_id, s.parent_span_id
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    };

    // Four services take part in a run (the janitor only sweeps; see the next test).
    let services: HashSet<&str> = spans.iter().map(|s| s.service.as_str()).collect();
    for want in [
        "gateway",
        "sandbox-provisioner",
        "agent-runner",
        "budget-ledger",
    ] {
        assert!(
            services.contains(want),
            "no {want} span in the run's trace:\n{}",
            dump()
        );
    }

    // One tree: every span's parent is in the trace, except the LaunchRun server span,
    // whose parent is the caller's span.
    let by_id: HashMap<&str, &SpanRecord> = spans.iter().map(|s| (s.span_id.as_str(), s)).collect();
    assert_eq!(by_id.len(), spans.len(), "span ids are unique");
    let roots: Vec<&SpanRecord> = spans
        .iter()
        .filter(|s| !by_id.contains_key(s.parent_span_id.as_str()))
        .collect();
    assert_eq!(roots.len(), 1, "one root:\n{}", dump());
    assert_eq!(roots[0].name, "forkyard.gateway.v1.Gateway/LaunchRun");
    assert_eq!(roots[0].parent_span_id, CALLER_SPAN);
    assert_eq!(roots[0].service, "gateway");

    // Each fork's steps hang under its fork workflow (inline: the run's workflow, with
    // its last steps under a FinishFork span of its own), under the run's workflow,
    // under LaunchRun; the agent span carries the fork's identity, tokens and cost.
    let fork_span = if inline {
        "FinishFork"
    } else {
        "RunWorkflow:ForkWorkflow"
    };
    let agent_under = if inline {
        "RunWorkflow:SandboxOrchestrationWorkflow"
    } else {
        "RunWorkflow:ForkWorkflow"
    };
    for fork in 1..=2u32 {
        let fork_wf = spans
            .iter()
            .find(|s| s.name == fork_span && s.attr_str("forkyard.fork") == Some(fork.to_string()))
            .unwrap_or_else(|| panic!("no fork {fork} {fork_span} span:\n{}", dump()));
        assert_eq!(
            fork_wf.attr_str("forkyard.run_id"),
            Some(launched.run_id.clone())
        );
        if !inline {
            assert_eq!(
                fork_wf.attr_str("forkyard.status").as_deref(),
                Some("succeeded")
            );
        }
        let chain = ancestry(fork_wf, &by_id);
        assert!(
            chain.contains(&"RunWorkflow:SandboxOrchestrationWorkflow")
                && chain.last() == Some(&"forkyard.gateway.v1.Gateway/LaunchRun"),
            "fork {fork}: {chain:?}"
        );
        let agent = spans
            .iter()
            .find(|s| {
                s.name == "RunActivity:agent.run"
                    && s.attr_str("forkyard.fork") == Some(fork.to_string())
            })
            .unwrap_or_else(|| panic!("no fork {fork} agent span:\n{}", dump()));
        assert_eq!(agent.service, "agent-runner");
        assert!(ancestry(agent, &by_id).contains(&agent_under));
        assert_eq!(
            fork_wf.attr_str("forkyard.sandbox_id"),
            agent.attr_str("forkyard.sandbox_id"),
            "the fork's span names its sandbox"
        );
        let cost: f64 = agent
            .attr_str("forkyard.cost_usd")
            .unwrap()
            .parse()
            .unwrap();
        assert!(
            (cost - (f64::from(fork) * 0.01 + 0.005)).abs() < 1e-9,
            "cost {cost}"
        );
        assert_eq!(
            agent.attr_str("forkyard.input_tokens").as_deref(),
            Some("100")
        );
        // In-process steps join the trace through tracing-opentelemetry: the runner's
        // charge of the fork's model turn (over every try), under the agent's activity,
        // with its gRPC call to the ledger under it and the ledger's server span under that.
        let charge = spans
            .iter()
            .find(|s| s.name == "ledger.charge" && descends_from(s, agent, &by_id))
            .unwrap_or_else(|| panic!("no ledger.charge under fork {fork}'s agent:\n{}", dump()));
        assert_eq!(charge.service, "agent-runner");
        assert_eq!(charge.attr_str("fork"), Some(fork.to_string()));
        assert_eq!(charge.attr_str("turn").as_deref(), Some("1"));
        // 100 input and 20 output tokens at $3 and $15 a million.
        assert_eq!(charge.attr_str("amount_micros").as_deref(), Some("600"));
        let ledger_server = spans
            .iter()
            .find(|s| {
                s.service == "budget-ledger"
                    && s.name == "forkyard.budget.v1.BudgetLedger/Charge"
                    && descends_from(s, charge, &by_id)
            })
            .unwrap_or_else(|| panic!("no ledger Charge under fork {fork}'s charge:\n{}", dump()));
        assert_eq!(
            by_id[ledger_server.parent_span_id.as_str()].service,
            "agent-runner",
            "the runner's client span is the ledger's parent"
        );
        let sandbox = agent.attr_str("forkyard.sandbox_id").expect("sandbox id");
        // The provisioner's steps for this sandbox: each command it ran (the agent's
        // included, named by its program only) and the patch's git step, each under the
        // gRPC call that asked for it.
        let in_sandbox = |name: &str| -> Vec<&SpanRecord> {
            spans
                .iter()
                .filter(|s| {
                    s.service == "sandbox-provisioner"
                        && s.name == name
                        && s.attr_str("sandbox_id").as_deref() == Some(sandbox.as_str())
                })
                .collect()
        };
        let patch = in_sandbox("git.patch");
        assert_eq!(patch.len(), 1, "one git.patch for {sandbox}:\n{}", dump());
        let execs = in_sandbox("sandbox.exec");
        assert!(
            execs.iter().any(|e| descends_from(e, patch[0], &by_id)),
            "the patch's command runs under git.patch:\n{}",
            dump()
        );
        assert!(
            execs.iter().any(|e| descends_from(e, agent, &by_id)
                && e.attr_str("program").as_deref() == Some("sh")
                && e.attr_str("exit_code").as_deref() == Some("0")),
            "the agent's command is a sandbox.exec under its activity:\n{}",
            dump()
        );
        // The run prepares the fork: its reserve, create and health check are the
        // fork's part of the wave's local activity in the gateway, under the run's
        // workflow, calling the provisioner over gRPC.
        let create = spans
            .iter()
            .find(|s| {
                s.name == "PrepareFork"
                    && s.attr_str("forkyard.sandbox_id").as_deref() == Some(sandbox.as_str())
            })
            .unwrap_or_else(|| panic!("no PrepareFork span for {sandbox}:\n{}", dump()));
        assert_eq!(create.service, "gateway");
        assert_eq!(create.attr_str("forkyard.fork"), Some(fork.to_string()));
        assert!(ancestry(create, &by_id).contains(&"RunWorkflow:SandboxOrchestrationWorkflow"));
        // This fork's own calls, each under its own span: its reserve, its create and
        // its health check.
        for (service, method) in [
            ("budget-ledger", "forkyard.budget.v1.BudgetLedger/Reserve"),
            (
                "sandbox-provisioner",
                "forkyard.sandbox.v1.SandboxProvisioner/CreateSandbox",
            ),
            (
                "sandbox-provisioner",
                "forkyard.sandbox.v1.SandboxProvisioner/HealthCheck",
            ),
        ] {
            let under_fork = spans
                .iter()
                .filter(|s| s.service == service && s.name == method)
                .filter(|s| descends_from(s, create, &by_id))
                .count();
            assert_eq!(
                under_fork,
                1,
                "{method} under fork {fork}'s PrepareFork:\n{}",
                dump()
            );
        }
    }
    // The ledger's part hangs under a fork: its activities, or (when the gateway makes the
    // ledger calls as local activities over gRPC) its gRPC server spans.
    assert!(
        spans
            .iter()
            .any(|s| s.service == "budget-ledger" && ancestry(s, &by_id).contains(&fork_span)),
        "no ledger span under a fork:\n{}",
        dump()
    );
    // Every gRPC server span is the child of the caller's client span for the same
    // method, in another service (context through gRPC metadata); the provisioner has
    // some (the agent runner's calls into the sandbox).
    let servers: Vec<&SpanRecord> = spans
        .iter()
        .filter(|s| s.name.starts_with("forkyard.") && s.name != roots[0].name)
        .filter(|s| by_id[s.parent_span_id.as_str()].service != s.service)
        .collect();
    assert!(
        servers.iter().any(|s| s.service == "sandbox-provisioner"),
        "no provisioner gRPC server span:\n{}",
        dump()
    );
    for server in &servers {
        let parent = by_id[server.parent_span_id.as_str()];
        assert_eq!(
            parent.name, server.name,
            "client and server span name the method"
        );
    }
    assert!(
        spans.iter().all(|s| s.status_code != 2),
        "no span failed in a clean run:\n{}",
        dump()
    );

    // The janitor, the fifth service, is no part of a run: its sweeps are traces of their
    // own, and they cross the mesh the same way (janitor → provisioner and ledger).
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
    let deadline = Instant::now() + Duration::from_secs(30);
    let sweep_spans = loop {
        let spans: Vec<SpanRecord> = sink
            .spans()
            .into_iter()
            .filter(|s| s.trace_id == SWEEP_TRACE_ID)
            .collect();
        let services: HashSet<String> = spans.iter().map(|s| s.service.clone()).collect();
        if services.len() >= 3 || Instant::now() > deadline {
            break spans;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let sweep_by_id: HashMap<&str, &SpanRecord> = sweep_spans
        .iter()
        .map(|s| (s.span_id.as_str(), s))
        .collect();
    for service in ["sandbox-provisioner", "budget-ledger"] {
        let server = sweep_spans
            .iter()
            .find(|s| s.service == service)
            .unwrap_or_else(|| panic!("no {service} span in the sweep's trace: {sweep_spans:#?}"));
        let chain = ancestry(server, &sweep_by_id);
        assert_eq!(
            chain.last(),
            Some(&"forkyard.janitor.v1.Janitor/SweepNow"),
            "{service}: {chain:?}"
        );
    }

    // Metrics, from each service's own /metrics.
    let page = |s: &str| mesh.scrape(s).unwrap();
    let gateway = page("gateway");
    assert_eq!(
        sample(
            &gateway,
            "sandbox_fork_completed_total",
            &[("status", "succeeded"), ("model", "none")]
        ),
        Some(2.0),
        "{gateway}"
    );
    assert_eq!(
        sample(
            &gateway,
            "sandbox_fork_duration_seconds_count",
            &[("status", "succeeded")]
        ),
        Some(2.0)
    );
    let fork_cost = sample(&gateway, "sandbox_fork_cost_usd_sum", &[("model", "none")]).unwrap();
    assert!((fork_cost - 0.04).abs() < 1e-9, "fork cost sum {fork_cost}");
    let launches = |code| {
        sample(
            &gateway,
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
    let prov = page("sandbox-provisioner");
    assert_eq!(
        sample(
            &prov,
            "sandbox_created_total",
            &[("template", "local"), ("status", "ok")]
        ),
        Some(2.0),
        "{prov}"
    );
    assert_eq!(sample(&prov, "active_sandboxes", &[]), Some(0.0));
    assert_eq!(
        sample(&prov, "sandbox_duration_seconds_count", &[]),
        Some(2.0)
    );
    let agent = page("agent-runner");
    assert_eq!(
        sample(&agent, "agent_cost_usd_count", &[("model", "none")]),
        Some(2.0)
    );
    let agent_cost = sample(&agent, "agent_cost_usd_sum", &[("model", "none")]).unwrap();
    assert!(
        (agent_cost - 0.04).abs() < 1e-9,
        "agent cost sum {agent_cost}"
    );
    // The Temporal SDK's worker metrics are on the same page.
    assert!(
        sample(
            &agent,
            "temporal_activity_execution_latency_seconds_count",
            &[("activity_type", "agent.run")]
        ) >= Some(2.0),
        "{agent}"
    );
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
    // Give the exporters a few failed batches, then: one warning per service whose spans
    // were dropped, not one per batch (the janitor takes no part in a run: no spans).
    tokio::time::sleep(Duration::from_secs(2)).await;
    let logs = mesh.state_dir().join("logs");
    let full_log = |service: &str| {
        std::fs::read_to_string(logs.join(format!("{service}.log"))).unwrap_or_default()
    };
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
    assert_eq!(
        log.matches("OTEL_EXPORTER_OTLP_ENDPOINT unusable, spans are dropped")
            .count(),
        1,
        "{log}"
    );
}
