//! `forkyard watch` outlives its gateway: the gateway killed and started again while a
//! run is watched, the watch reconnects and ends with the run, with the run's exit code.

use forkyard_tests::{
    Mesh,
    mesh::bin_dir,
    repo,
    support::{Gateway, launch, wait_until},
};
use std::time::{Duration, Instant};

const AGENT: &str = r#"echo "fork $FORKYARD_FORK" > "fork-$FORKYARD_FORK.txt"
sleep 6
printf '{"type":"result","total_cost_usd":0.001,"usage":{"input_tokens":10,"output_tokens":2}}\n'"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_reconnects_after_the_gateway_restarts_and_ends_with_the_run() {
    let mut mesh = Mesh::start().await.expect("mesh starts");
    let src = tempfile::tempdir().unwrap();
    repo::create(src.path()).unwrap();
    let mut gw = Gateway::new(mesh.channel("gateway").await.unwrap());
    let run_id = gw
        .launch_run(launch(src.path(), 2, 2, AGENT))
        .await
        .unwrap()
        .into_inner()
        .run_id;
    wait_until(&mut gw, &run_id, Duration::from_secs(60), |r| {
        r.forks_running == 2
    })
    .await;

    let watch = std::process::Command::new(bin_dir().join("forkyard"))
        .args(["--gateway", &mesh.endpoint("gateway"), "watch", &run_id])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    mesh.kill9("gateway");
    tokio::time::sleep(Duration::from_secs(2)).await;
    mesh.start_service("gateway").unwrap();

    let started = Instant::now();
    let out = tokio::task::spawn_blocking(move || watch.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    assert!(stderr.contains("reconnecting"), "{stderr}");
    assert!(
        stdout.contains("succeeded") && stdout.contains(&run_id),
        "{stdout}"
    );
    assert!(started.elapsed() < Duration::from_secs(120));
}
