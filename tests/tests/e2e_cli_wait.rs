//! `forkyard fork --wait` and `forkyard watch` end with the run: within about 100 ms of
//! the run's end (its `finishedUnixMs`), not at the gateway's next look a second later.

use forkyard_tests::{fixture::setup, mesh::bin_dir};
use std::time::{SystemTime, UNIX_EPOCH};

fn now_ms() -> i64 {
    let since = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    i64::try_from(since.as_millis()).unwrap()
}

/// `forkyard <args>` (ending in `-o json`, printing the final run): how many ms after
/// the run's end the command had ended, and the run id.
fn ms_after_the_end(gateway: &str, args: &[&str]) -> (i64, String) {
    let out = std::process::Command::new(bin_dir().join("forkyard"))
        .args(["--gateway", gateway])
        .args(args)
        .env("FORKYARD_CONFIG", "/nonexistent/forkyard.toml")
        .output()
        .unwrap();
    let ended = now_ms();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let run: serde_json::Value = serde_json::from_str(&stdout).expect("json run");
    let finished: i64 = run["finishedUnixMs"].as_str().unwrap().parse().unwrap();
    (ended - finished, run["runId"].as_str().unwrap().to_owned())
}

/// The best of a few tries: a loaded machine may delay one, never all of them by a
/// second as a poll did.
const TRIES: usize = 3;
const WITHIN_MS: i64 = 150;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fork_wait_and_watch_end_with_the_runs_final_event() {
    let (mesh, src, _gw) = setup().await;
    let gateway = mesh.endpoint("gateway");
    let repo = src.path().to_str().unwrap();
    // The watched runs last a second, so the watch is there before they end.
    let one_fork = |wait: bool| {
        let agent = if wait { "true" } else { "sleep 1" };
        let mut args = vec!["fork", repo, "-p", "x", "-f", "1", "--agent-command", agent];
        args.extend(if wait {
            ["--wait", "-o", "json"].as_slice()
        } else {
            &[]
        });
        args.into_iter().map(str::to_owned).collect::<Vec<_>>()
    };
    let mut waits = Vec::new();
    for _ in 0..TRIES {
        let args = one_fork(true);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        waits.push(ms_after_the_end(&gateway, &args).0);
    }
    let mut watches = Vec::new();
    for _ in 0..TRIES {
        let args = one_fork(false);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = std::process::Command::new(bin_dir().join("forkyard"))
            .args(["--gateway", &gateway])
            .args(&args)
            .output()
            .unwrap();
        let run_id = String::from_utf8(out.stdout).unwrap().trim().to_owned();
        watches.push(ms_after_the_end(&gateway, &["watch", &run_id, "-o", "json"]).0);
    }
    eprintln!("fork --wait ended {waits:?} ms after its run; watch {watches:?}");
    assert!(
        waits.iter().min().unwrap() <= &WITHIN_MS,
        "fork --wait ended {waits:?} ms after its run"
    );
    assert!(
        watches.iter().min().unwrap() <= &WITHIN_MS,
        "watch ended {watches:?} ms after its run"
    );
}
