//! A run's network: `egress` lists hosts and the operator's sets, bounded by the tenant's
//! policy; the fork's sandbox reaches those through the provisioner's egress proxy and
//! nothing else. Asking beyond the policy is PERMISSION_DENIED naming the host; the
//! host's own loopback only when the operator lists it.

use forkyard_proto::{
    common::v1::ForkStatus,
    gateway::v1::{GetRunRequest, LaunchRunRequest, RunState, gateway_client::GatewayClient},
};
use forkyard_tests::{
    Mesh,
    mesh::MeshOptions,
    repo,
    support::{fork_result, launch, wait_finished},
};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic::Code;

/// An HTTP server on the host's loopback answering `body`; its port.
async fn http_server(body: &'static str) -> u16 {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut c, _)) = l.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 2048];
                let _ = c.read(&mut buf).await;
                let reply = format!(
                    "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = c.write_all(reply.as_bytes()).await;
            });
        }
    });
    port
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_reaches_what_its_egress_lists_within_the_tenant_policy_and_nothing_else() {
    let allowed = http_server("hello from the allowed host").await;
    let other = http_server("you should not see this").await;
    let listed = format!("127.0.0.1:{allowed}");
    let options = MeshOptions {
        service_env: vec![
            (
                "gateway".into(),
                "FORKYARD_TENANT_EGRESS".into(),
                format!("*=npm,{listed}"),
            ),
            (
                "sandbox-provisioner".into(),
                "FORKYARD_EGRESS_PRIVATE_ALLOWED".into(),
                "127.0.0.1".into(),
            ),
        ],
        ..Default::default()
    };
    let mesh = Mesh::start_with(options).await.expect("mesh");
    let dir = tempfile::tempdir().unwrap();
    repo::create(dir.path()).unwrap();
    let mut gw = GatewayClient::new(mesh.channel("gateway").await.unwrap());

    // Beyond the policy, or the host's own services: refused before anything starts.
    for (i, (egress, code, names)) in [
        ("pypi", Code::PermissionDenied, "pypi"),
        ("example.com", Code::PermissionDenied, "example.com"),
        ("127.0.0.1:7233", Code::InvalidArgument, "127.0.0.1:7233"),
        ("169.254.169.254", Code::InvalidArgument, "169.254.169.254"),
    ]
    .into_iter()
    .enumerate()
    {
        let req = LaunchRunRequest {
            request_id: format!("egress-refused-{i}"),
            egress: vec![egress.into()],
            ..launch(dir.path(), 1, 1, "true")
        };
        let err = gw.launch_run(req).await.expect_err(egress);
        assert_eq!(err.code(), code, "{egress}: {err:?}");
        assert!(err.message().starts_with("egress"), "{}", err.message());
        assert!(err.message().contains(names), "{}", err.message());
        let missing = gw
            .get_run(GetRunRequest {
                run_id: format!("run-egress-refused-{i}"),
            })
            .await;
        assert_eq!(missing.unwrap_err().code(), Code::NotFound);
    }

    // The listed host answers through the proxy; another port of the same host does not.
    let command = format!(
        "export NO_PROXY= no_proxy=; \
         curl -sS --max-time 10 http://{listed}/ > reached.txt 2>&1; \
         curl -s -o /dev/null -w '%{{http_code}}' --max-time 10 http://127.0.0.1:{other}/ > refused.txt; \
         env | grep -E '^(HTTPS_PROXY|FORKYARD_LLM_URL)=' | sort > net-env.txt"
    );
    let req = LaunchRunRequest {
        request_id: "egress-ok".into(),
        egress: vec![listed.clone(), "npm".into()],
        ..launch(dir.path(), 1, 1, &command)
    };
    let run_id = gw.launch_run(req).await.unwrap().into_inner().run_id;
    let run = wait_finished(&mut gw, &run_id, Duration::from_secs(90)).await;
    assert_eq!(run.state, RunState::Completed as i32, "{run:#?}");
    assert_eq!(
        run.spec.as_ref().unwrap().egress,
        [listed.clone(), "registry.npmjs.org".to_owned()],
        "sets expand into the run's spec"
    );
    let fork = fork_result(&mut gw, &run_id, 1).await;
    assert_eq!(fork.status, ForkStatus::Succeeded as i32, "{fork:#?}");
    assert!(
        fork.patch.contains("+hello from the allowed host"),
        "{}",
        fork.patch
    );
    assert!(fork.patch.contains("+403"), "{}", fork.patch);
    assert!(
        !fork.patch.contains("you should not see this"),
        "{}",
        fork.patch
    );
    assert!(
        fork.patch.contains("+HTTPS_PROXY=http://127.0.0.1:3128"),
        "{}",
        fork.patch
    );
    assert!(
        fork.patch
            .contains("+FORKYARD_LLM_URL=http://127.0.0.1:4000"),
        "{}",
        fork.patch
    );
}
