//! Random and malformed requests at every RPC of the gateway, over gRPC as raw bytes (so
//! they can be what no client library would send: not protobuf at all, strings that are
//! not UTF-8, oversized bodies, absurd numbers). The gateway must answer each with a
//! proper status — never INTERNAL/UNKNOWN/UNAVAILABLE, never a hang — keep serving, and
//! start nothing.

use bytes::{Buf, BufMut};
use forkyard_proto::{
    common::v1::AgentSpec,
    gateway::v1::{LaunchRunRequest, ListRunsRequest, gateway_client::GatewayClient},
};
use forkyard_tests::{Mesh, mesh::MeshOptions, support::workspaces_left};
use proptest::{prelude::*, test_runner::TestRunner};
use prost::Message;
use std::{collections::HashMap, time::Duration};
use tonic::{
    Code, Request, Status,
    codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder},
    transport::Channel,
};

const METHODS: &[&str] = &[
    "LaunchRun",
    "GetRun",
    "WatchRun",
    "ListRuns",
    "PauseRun",
    "ResumeRun",
    "CancelRun",
    "CancelFork",
    "RaiseBudget",
    "GetForkResult",
    "StartCleanup",
    "StopCleanup",
];

/// Bytes in, bytes out: the request body is whatever the test says.
#[derive(Clone, Copy, Default)]
struct Raw;

impl Codec for Raw {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = Raw;
    type Decoder = Raw;
    fn encoder(&mut self) -> Raw {
        Raw
    }
    fn decoder(&mut self) -> Raw {
        Raw
    }
}

impl Encoder for Raw {
    type Item = Vec<u8>;
    type Error = Status;
    fn encode(&mut self, item: Vec<u8>, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put_slice(&item);
        Ok(())
    }
}

impl Decoder for Raw {
    type Item = Vec<u8>;
    type Error = Status;
    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Vec<u8>>, Status> {
        let mut v = vec![0; src.remaining()];
        src.copy_to_slice(&mut v);
        Ok(Some(v))
    }
}

/// Call `method` with `body`; the status code (OK when it succeeded).
async fn call(channel: &Channel, key: &str, method: &str, body: Vec<u8>) -> Status {
    let mut grpc = tonic::client::Grpc::new(channel.clone());
    if let Err(e) = grpc.ready().await {
        return Status::unavailable(e.to_string());
    }
    let mut req = Request::new(body);
    req.metadata_mut()
        .insert("authorization", format!("Bearer {key}").parse().unwrap());
    req.set_timeout(Duration::from_secs(20));
    let path = format!("/forkyard.gateway.v1.Gateway/{method}")
        .parse()
        .expect("path");
    let result = if method == "WatchRun" {
        match grpc.server_streaming(req, path, Raw).await {
            Ok(mut stream) => match stream.get_mut().message().await {
                Ok(_) => Ok(()),
                Err(s) => Err(s),
            },
            Err(s) => Err(s),
        }
    } else {
        grpc.unary(req, path, Raw).await.map(|_| ())
    };
    match result {
        Ok(()) => Status::ok(""),
        Err(s) => s,
    }
}

/// Codes a hostile request may get. INTERNAL, UNKNOWN, UNAVAILABLE (a crash) and
/// DEADLINE_EXCEEDED / CANCELLED (a hang) may not.
fn proper(method: &str, s: &Status) -> bool {
    match s.code() {
        Code::InvalidArgument
        | Code::NotFound
        | Code::FailedPrecondition
        | Code::AlreadyExists
        | Code::OutOfRange
        | Code::ResourceExhausted
        | Code::PermissionDenied => true,
        // Reads of nothing in particular may succeed; a launch of garbage may not.
        Code::Ok => !matches!(method, "LaunchRun"),
        _ => false,
    }
}

fn launch(repo: String, prompt: String, forks: u32, labels: HashMap<String, String>) -> Vec<u8> {
    LaunchRunRequest {
        repo,
        prompt,
        forks,
        max_concurrent: forks,
        budget_usd: "1".into(),
        agent: Some(AgentSpec {
            driver: "command".into(),
            command: "true".into(),
            ..Default::default()
        }),
        labels,
        ..Default::default()
    }
    .encode_to_vec()
}

/// `msg` encoded, with the placeholder's bytes replaced by invalid UTF-8 of equal length.
fn with_invalid_utf8(encoded: Vec<u8>, placeholder: &str) -> Vec<u8> {
    let p = placeholder.as_bytes();
    let at = encoded
        .windows(p.len())
        .position(|w| w == p)
        .expect("placeholder in the encoding");
    let mut out = encoded;
    for b in &mut out[at..at + p.len()] {
        *b = 0xff;
    }
    out
}

fn hostile() -> impl Strategy<Value = (usize, Vec<u8>)> {
    let method = 0..METHODS.len();
    prop_oneof![
        // Any bytes at all.
        (method.clone(), prop::collection::vec(any::<u8>(), 0..2048)),
        // Well-formed launches with absurd numbers, huge prompts, many nested labels.
        (
            prop_oneof![Just(0u32), Just(u32::MAX), any::<u32>()],
            prop_oneof![Just(0usize), Just(70_000usize), Just(1_000_000usize)],
            0usize..400,
        )
            .prop_map(|(forks, prompt_len, n_labels)| {
                let labels = (0..n_labels)
                    .map(|i| (format!("k{i}{}", "/x".repeat(i % 40)), "{".repeat(i)))
                    .collect();
                (
                    0,
                    launch("/nonexistent".into(), "p".repeat(prompt_len), forks, labels),
                )
            }),
        // Invalid UTF-8 where every RPC expects a string (the run id, a path, a label).
        (method, 0usize..3).prop_map(|(m, which)| {
            const MARK: &str = "MARKMARK";
            let body = match (METHODS[m], which) {
                ("LaunchRun", 0) => launch(MARK.into(), "p".into(), 1, HashMap::new()),
                ("LaunchRun", 1) => launch(
                    "/tmp".into(),
                    "p".into(),
                    1,
                    HashMap::from([(MARK.to_owned(), "v".to_owned())]),
                ),
                ("ListRuns", _) => ListRunsRequest {
                    labels: HashMap::from([("k".to_owned(), MARK.to_owned())]),
                    ..Default::default()
                }
                .encode_to_vec(),
                // Field 1 of every other request is the run id (or a string): tag 0x0a.
                _ => {
                    let mut b = vec![0x0a, MARK.len() as u8];
                    b.extend_from_slice(MARK.as_bytes());
                    b
                }
            };
            (m, with_invalid_utf8(body, MARK))
        }),
    ]
}

#[test]
fn hostile_requests_get_a_proper_status_and_start_nothing() -> anyhow::Result<()> {
    let rt = tokio::runtime::Runtime::new()?;
    let mesh = rt.block_on(Mesh::start_with(MeshOptions {
        api_keys: true,
        env: vec![
            // The fuzzer is one tenant calling fast: no rate limit in the way.
            ("FORKYARD_TENANT_RATE".into(), "100000".into()),
            ("FORKYARD_TENANT_BURST".into(), "100000".into()),
        ],
        ..Default::default()
    }))?;
    let out = std::process::Command::new(forkyard_tests::mesh::bin_dir().join("forkyard"))
        .env("FORKYARD_STATE_DIR", mesh.state_dir())
        .args(["-o", "json", "keys", "create", "--tenant", "fuzz"])
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let key = serde_json::from_slice::<serde_json::Value>(&out.stdout)?["key"]
        .as_str()
        .unwrap()
        .to_owned();
    let channel = rt.block_on(mesh.channel("gateway"))?;

    let mut runner = TestRunner::new(ProptestConfig {
        cases: 300,
        ..ProptestConfig::default()
    });
    let seen = std::cell::RefCell::new(HashMap::<Code, usize>::new());
    runner
        .run(&hostile(), |(m, body)| {
            let method = METHODS[m];
            let status = rt.block_on(call(&channel, &key, method, body.clone()));
            *seen.borrow_mut().entry(status.code()).or_default() += 1;
            prop_assert!(
                proper(method, &status),
                "{method} with {} bytes: {status:?}",
                body.len()
            );
            if status.code() == Code::InvalidArgument {
                prop_assert!(!status.message().is_empty(), "{method}: empty message");
            }
            Ok(())
        })
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    println!("status codes over the run: {:?}", seen.borrow());

    // Invalid UTF-8 in a path is refused naming the field.
    let body = with_invalid_utf8(
        launch("MARKMARK".into(), "p".into(), 1, HashMap::new()),
        "MARKMARK",
    );
    let s = rt.block_on(call(&channel, &key, "LaunchRun", body));
    assert_eq!(s.code(), Code::InvalidArgument, "{s:?}");
    assert!(s.message().contains("LaunchRunRequest.repo"), "{s:?}");

    // A call with no request message at all (a body without a gRPC frame), at every
    // service: INVALID_ARGUMENT naming the request, not INTERNAL.
    for (service, path) in [
        ("gateway", "/forkyard.gateway.v1.Gateway/LaunchRun"),
        (
            "sandbox-provisioner",
            "/forkyard.sandbox.v1.SandboxProvisioner/Exec",
        ),
        ("agent-runner", "/forkyard.agent.v1.AgentRunner/RunAgent"),
        ("budget-ledger", "/forkyard.budget.v1.BudgetLedger/Charge"),
        ("janitor", "/forkyard.janitor.v1.Janitor/SweepNow"),
    ] {
        let ch = rt.block_on(mesh.channel(service))?;
        let mut grpc = tonic::client::Grpc::new(ch);
        let mut req = Request::new(futures::stream::empty::<Vec<u8>>());
        req.metadata_mut()
            .insert("authorization", format!("Bearer {key}").parse().unwrap());
        let got = rt.block_on(async {
            grpc.ready()
                .await
                .map_err(|e| Status::unavailable(e.to_string()))?;
            grpc.client_streaming(req, path.parse().unwrap(), Raw).await
        });
        let s = got.expect_err("an empty call succeeded");
        assert_eq!(s.code(), Code::InvalidArgument, "{service}: {s:?}");
        assert!(s.message().starts_with("request"), "{service}: {s:?}");
    }

    // Still serving, and nothing was started.
    let mut gw = GatewayClient::new(channel.clone());
    let mut req = Request::new(ListRunsRequest::default());
    req.metadata_mut()
        .insert("authorization", format!("Bearer {key}").parse().unwrap());
    let runs = rt.block_on(gw.list_runs(req))?.into_inner().runs;
    assert!(runs.is_empty(), "runs started by garbage: {runs:?}");
    assert!(
        workspaces_left(mesh.state_dir()).is_empty(),
        "sandboxes made by garbage"
    );
    Ok(())
}
