//! End to end: a run's remote repository on the mesh's own host. By default LaunchRun
//! refuses it with one message whatever answers on the port (a git server, the mesh's
//! metrics, Temporal, nothing, sshd): it was a port scanner of the gateway's host. Once
//! the operator lists the git server (`FORKYARD_ALLOWED_GIT_HOSTS`, gateway and
//! provisioner), the run reads it and every fork clones it.

use forkyard_proto::{
    common::v1::ForkStatus,
    gateway::v1::{RunState, gateway_client::GatewayClient},
};
use forkyard_tests::{
    Mesh,
    git_server::GitDaemon,
    mesh::MeshOptions,
    repo,
    support::{launch, run_to_end},
};
use std::time::Duration;
use tonic::Code;

const AGENT: &str =
    r#"echo "fork $FORKYARD_FORK" > done.txt; printf '{"total_cost_usd": 0.001}\n'"#;

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_loopback_repository_is_refused_alike_until_the_operator_lists_it() {
    let src = tempfile::tempdir().unwrap();
    repo::create(src.path()).unwrap();
    let daemon = GitDaemon::serve(src.path());
    let url = format!("git://127.0.0.1:{}/r.git", daemon.port);

    let mesh = Mesh::start().await.expect("mesh starts");
    let mut gw = GatewayClient::new(mesh.channel("gateway").await.unwrap());
    let probes = [
        url.clone(),
        format!("git://127.0.0.1:{}/r.git", free_port()),
        format!("http://127.0.0.1:{}/r.git", mesh.metrics_port("gateway")),
        format!("http://127.0.0.1:{}/r.git", mesh.temporal_port),
        "ssh://127.0.0.1:22/r.git".to_owned(),
    ];
    for repo in &probes {
        let mut req = launch(src.path(), 1, 1, AGENT);
        req.repo.clone_from(repo);
        let err = gw.launch_run(req).await.unwrap_err();
        assert_eq!(err.code(), Code::FailedPrecondition, "{repo}: {err:?}");
        assert_eq!(
            err.message(),
            format!("repo: repository {repo} cannot be read")
        );
    }
    drop(gw);
    drop(mesh);

    let listed = format!("127.0.0.1:{}", daemon.port);
    let mesh = Mesh::start_with(MeshOptions {
        service_env: ["gateway", "sandbox-provisioner"]
            .iter()
            .map(|s| {
                let var = "FORKYARD_ALLOWED_GIT_HOSTS";
                ((*s).to_owned(), var.to_owned(), listed.clone())
            })
            .collect(),
        ..Default::default()
    })
    .await
    .expect("mesh starts");
    let mut gw = GatewayClient::new(mesh.channel("gateway").await.unwrap());
    let mut req = launch(src.path(), 2, 2, AGENT);
    req.repo.clone_from(&url);
    let (_, run) = run_to_end(&mut gw, req, Duration::from_secs(120)).await;
    assert_eq!(run.state, RunState::Completed as i32, "{run:#?}");
    for f in &run.forks {
        assert_eq!(f.status, ForkStatus::Succeeded as i32, "{f:#?}");
    }
}
