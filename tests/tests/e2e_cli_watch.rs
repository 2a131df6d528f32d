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

    let mut watch = std::process::Command::new(bin_dir().join("forkyard"))
        .args(["--gateway", &mesh.endpoint("gateway"), "watch", &run_id])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // What the watch says on stderr (one line per event, and its reconnects), as it says it.
    let said = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let reader = {
        let said = said.clone();
        let stderr = watch.stderr.take().unwrap();
        std::thread::spawn(move || {
            use std::io::BufRead as _;
            for line in std::io::BufReader::new(stderr)
                .lines()
                .map_while(Result::ok)
            {
                let mut s = said.lock().unwrap();
                s.push_str(&line);
                s.push('\n');
            }
        })
    };
    let said_so = |what: &'static str| {
        let said = said.clone();
        async move {
            let deadline = Instant::now() + Duration::from_secs(60);
            while !what_said(&said.lock().unwrap(), what) {
                assert!(
                    Instant::now() < deadline,
                    "the watch never said {what:?}: {}",
                    said.lock().unwrap()
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    // The watch's stream is open (it has told an event: the agents' progress comes
    // every heartbeat) when the gateway is killed, and it has noticed before the
    // gateway is back.
    said_so("an event").await;
    mesh.kill9("gateway");
    said_so("reconnecting").await;
    mesh.start_service("gateway").unwrap();

    let out = tokio::task::spawn_blocking(move || watch.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    reader.join().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = said.lock().unwrap().clone();
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    assert!(stderr.contains("reconnecting"), "{stderr}");
    assert!(
        stdout.contains("succeeded") && stdout.contains(&run_id),
        "{stdout}"
    );
}

/// Whether the watch's stderr so far has `what`: "an event" is any line that is not a
/// reconnect.
fn what_said(said: &str, what: &str) -> bool {
    match what {
        "an event" => said.lines().any(|l| !l.starts_with("watch: ")),
        _ => said.contains(what),
    }
}
