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
    mesh::MeshOptions,
    repo,
    support::{launch, run_to_end},
};
use std::{
    path::Path,
    process::{Child, Command, Stdio},
    time::Duration,
};
use tonic::Code;

const AGENT: &str =
    r#"echo "fork $FORKYARD_FORK" > done.txt; printf '{"total_cost_usd": 0.001}\n'"#;

/// `git daemon` serving `<base>/r.git` on a free loopback port; killed when dropped.
struct Daemon(Child, u16);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

fn serve(src: &Path, base: &Path) -> Daemon {
    let ok = Command::new("git")
        .args(["clone", "-q", "--bare"])
        .arg(src)
        .arg(base.join("r.git"))
        .status()
        .unwrap()
        .success();
    assert!(ok, "git clone --bare");
    let port = free_port();
    let daemon = Daemon(
        Command::new("git")
            .args([
                "daemon",
                "--listen=127.0.0.1",
                "--export-all",
                "--reuseaddr",
            ])
            .arg(format!("--port={port}"))
            .arg(format!("--base-path={}", base.display()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("git daemon"),
        port,
    );
    for _ in 0..400 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return daemon;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    panic!("git daemon did not start on port {port}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_loopback_repository_is_refused_alike_until_the_operator_lists_it() {
    let src = tempfile::tempdir().unwrap();
    repo::create(src.path()).unwrap();
    let served = tempfile::tempdir().unwrap();
    let daemon = serve(src.path(), served.path());
    let url = format!("git://127.0.0.1:{}/r.git", daemon.1);

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

    let listed = format!("127.0.0.1:{}", daemon.1);
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
