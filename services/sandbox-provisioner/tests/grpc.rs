//! The gRPC front door end to end: a real tonic server and client over TCP.

mod common;

use common::{eventually, fixture, host_pids_with, unique_sleep};
use forkyard_proto::sandbox::v1::{
    DestroySandboxRequest, ExecRequest, GetSandboxRequest, ListSandboxesRequest,
    sandbox_provisioner_client::SandboxProvisionerClient,
};
use forkyard_sandbox_provisioner::SandboxService;
use std::time::Duration;
use tonic::{Code, service::Routes};

#[tokio::test]
async fn grpc_calls_map_errors_and_a_hung_up_exec_is_killed() {
    let f = fixture().await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let routes = Routes::new(SandboxService::new(f.core.clone()).into_server());
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(forkyard_common::server::serve(listener, routes, async {
        let _ = stop_rx.await;
    }));
    let mut client = SandboxProvisionerClient::connect(format!("http://{addr}"))
        .await
        .unwrap();

    let mut bad = f.request("bad..branch");
    let err = client.create_sandbox(bad.clone()).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    bad.branch = "ok".into();
    bad.repo = "/nonexistent/repo".into();
    assert_eq!(
        client.create_sandbox(bad).await.unwrap_err().code(),
        Code::FailedPrecondition
    );
    let err = client
        .get_sandbox(GetSandboxRequest {
            sandbox_id: "sbx-missing".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);

    let sbx = client
        .create_sandbox(f.request("forkyard-fork-1"))
        .await
        .unwrap()
        .into_inner();
    let listed = client
        .list_sandboxes(ListSandboxesRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.sandboxes.len(), 1);
    let out = client
        .exec(ExecRequest {
            sandbox_id: sbx.id.clone(),
            argv: vec!["echo".into(), "hi".into()],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((out.exit_code, out.stdout.as_str()), (0, "hi\n"));

    // The caller gives up on a long exec (as agent-runner does when its activity is
    // cancelled): the sandboxed process must die.
    let secs = unique_sleep();
    let mut caller = client.clone();
    let req = ExecRequest {
        sandbox_id: sbx.id.clone(),
        argv: vec!["sleep".into(), secs.clone()],
        ..Default::default()
    };
    let call = tokio::spawn(async move { caller.exec(req).await });
    assert!(
        eventually(Duration::from_secs(10), || !host_pids_with(&format!(
            "sleep {secs}"
        ))
        .is_empty())
        .await
    );
    call.abort();
    assert!(
        eventually(Duration::from_secs(5), || host_pids_with(&format!(
            "sleep {secs}"
        ))
        .is_empty())
        .await,
        "exec survived the hung-up call"
    );

    let gone = client
        .destroy_sandbox(DestroySandboxRequest {
            sandbox_id: sbx.id.clone(),
            reason: "test".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(gone.existed);
    let _ = stop_tx.send(());
    server.await.unwrap().unwrap();
}
