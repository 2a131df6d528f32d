//! Mesh mTLS end to end: certificates from `scripts/certs.sh`, every service serving TLS,
//! internal services refusing callers without a certificate from the mesh CA (no
//! certificate, a plaintext connection, a certificate from another CA), the public
//! gateway taking TLS without a client certificate, and a run completing with every
//! internal call (agent runner → provisioner and ledger, gateway → ledger) over mTLS.

use forkyard_proto::gateway::v1::gateway_client::GatewayClient;
use forkyard_tests::{
    Mesh,
    mesh::MeshOptions,
    repo,
    scripted_model::{Script, ScriptedModel},
    support::{fork_result, launch, wait_finished},
};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic_health::pb::{
    HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
};

async fn serving(ch: tonic::transport::Channel) -> Result<bool, tonic::Status> {
    let mut h = HealthClient::new(ch);
    let mut req = tonic::Request::new(HealthCheckRequest::default());
    req.set_timeout(Duration::from_secs(5));
    Ok(h.check(req).await?.into_inner().status == ServingStatus::Serving as i32)
}

/// A client certificate signed by some other CA, in the mesh's certs dir as
/// `rogue-client`, for the impostor.
fn rogue_client_certificate(mesh: &Mesh) -> anyhow::Result<()> {
    let rogue = mesh.state_dir().join("rogue-certs");
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/certs.sh");
    let out = std::process::Command::new("bash")
        .arg(&script)
        .arg(&rogue)
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for f in ["client.pem", "client.key"] {
        std::fs::copy(rogue.join(f), mesh.certs_dir().join(format!("rogue-{f}")))?;
    }
    Ok(())
}

/// Each internal service serves the mesh's own certificate and nothing else: not a caller
/// without one, not one from another CA, not plain gRPC.
async fn assert_internal_services_demand_the_mesh_ca(mesh: &Mesh) -> anyhow::Result<()> {
    for service in [
        "sandbox-provisioner",
        "agent-runner",
        "budget-ledger",
        "janitor",
    ] {
        // The mesh's own client certificate: served.
        assert!(serving(mesh.channel(service).await?).await?, "{service}");
        // TLS without a client certificate: the handshake or the call is refused.
        let anonymous = match mesh.tls_channel(service, None).await {
            Ok(ch) => serving(ch).await.is_ok(),
            Err(_) => false,
        };
        assert!(
            !anonymous,
            "{service} served a caller without a certificate"
        );
        // A certificate from another CA.
        let impostor = match mesh.tls_channel(service, Some("rogue-client")).await {
            Ok(ch) => serving(ch).await.is_ok(),
            Err(_) => false,
        };
        assert!(!impostor, "{service} served a certificate from another CA");
        // Plain gRPC.
        let plain = match tonic::transport::Endpoint::from_shared(mesh.endpoint(service))?
            .connect_timeout(Duration::from_secs(2))
            .connect()
            .await
        {
            Ok(ch) => serving(ch).await.is_ok(),
            Err(_) => false,
        };
        assert!(!plain, "{service} answered plaintext gRPC");
    }
    Ok(())
}

/// Two forks whose agents call their model complete, the calls metered.
async fn assert_a_run_completes_over_mtls(
    mesh: &Mesh,
    model: &ScriptedModel,
) -> anyhow::Result<()> {
    let src = mesh.state_dir().join("repo");
    repo::create(&src)?;
    let mut gw = GatewayClient::new(mesh.channel("gateway").await?);
    // Each fork's agent also calls its model: sandbox → provisioner relay → the runner's
    // LLM gateway, that hop over mesh TLS too.
    let command = r#"echo over-mtls > mtls.txt; curl -sSf -H "x-api-key: $ANTHROPIC_API_KEY" -H 'anthropic-version: 2023-06-01' -H 'content-type: application/json' -d '{"model":"claude-haiku-4-5","max_tokens":16,"messages":[{"role":"user","content":"hi"}]}' "$ANTHROPIC_BASE_URL/v1/messages" > answer.json"#;
    let run = gw
        .launch_run(launch(&src, 2, 2, command))
        .await?
        .into_inner();
    let done = wait_finished(&mut gw, &run.run_id, Duration::from_secs(120)).await;
    assert_eq!(done.forks_succeeded, 2, "{done:#?}");
    assert!(
        done.cost_micros > 0,
        "the model calls were metered: {done:#?}"
    );
    assert_eq!(model.model_calls().len(), 2);
    let fork = fork_result(&mut gw, &run.run_id, 1).await;
    assert!(fork.patch.contains("msg_scripted_"), "{}", fork.patch);
    Ok(())
}

/// The LLM gateway's port takes no plaintext, not even with a sandbox header.
async fn assert_llm_gateway_refuses_plaintext(mesh: &Mesh) -> anyhow::Result<()> {
    let mut plain = tokio::net::TcpStream::connect(("127.0.0.1", mesh.llm_port)).await?;
    plain
        .write_all(&forkyard_common::proxy_header::encode("sbx-forged"))
        .await?;
    plain
        .write_all(b"GET /v1/models HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        .await?;
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), plain.read_to_end(&mut answer)).await;
    assert!(
        !String::from_utf8_lossy(&answer).contains("HTTP/1.1"),
        "plaintext answered: {}",
        String::from_utf8_lossy(&answer)
    );
    Ok(())
}

#[tokio::test]
async fn internal_services_demand_a_mesh_certificate_and_a_run_completes_over_mtls()
-> anyhow::Result<()> {
    let model = ScriptedModel::start(Script::edit("true")).await;
    let mesh = Mesh::start_with(MeshOptions {
        tls: true,
        service_env: vec![(
            "agent-runner".into(),
            "ANTHROPIC_BASE_URL".into(),
            model.url.clone(),
        )],
        ..Default::default()
    })
    .await?;
    rogue_client_certificate(&mesh)?;
    assert_internal_services_demand_the_mesh_ca(&mesh).await?;
    // The public gateway: TLS, API keys (off here) instead of client certificates.
    assert!(serving(mesh.tls_channel("gateway", None).await?).await?);
    assert_a_run_completes_over_mtls(&mesh, &model).await?;
    assert_llm_gateway_refuses_plaintext(&mesh).await
}
