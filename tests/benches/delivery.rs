//! Delivery's push (`forkyard_gateway::activities::deliver::push`): the branches of a 100-fork run
//! pushed to a local git server (git's `http-backend` behind lighttpd, basic auth), each
//! fork's commit made from its patch on the gateway's side. Prints p50 and the slowest
//! of several rounds, and how many HTTP requests one delivery made of the server: one
//! fetch and one push, however many forks (issue 43's target: under 5 s).
//!
//! `cargo bench -p forkyard-tests --bench delivery [-- --forks N --rounds N]`

use base64::Engine as _;
use forkyard_gateway::activities::deliver::push::{self, Access, Change, Signature};
use forkyard_tests::{git_server::GitHttp, repo};
use std::time::{Duration, Instant};

fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Fork n's patch: a file of its own, and a line added to the README.
fn patch(n: usize) -> String {
    format!(
        "diff --git a/fork-{n}.txt b/fork-{n}.txt\nnew file mode 100644\n--- /dev/null\n+++ b/fork-{n}.txt\n@@ -0,0 +1,2 @@\n+fork {n}\n+was here\n"
    )
}

fn changes(forks: usize, round: usize, base: &str) -> Vec<Change> {
    (1..=forks)
        .map(|n| Change {
            fork: n as u32,
            branch: format!("bench-{round}-fork-{n}"),
            base_commit: base.to_owned(),
            patch: patch(n),
            message: format!("fork {n}\n"),
            author: Signature {
                name: "bench".into(),
                email: "bench@localhost".into(),
                unix_secs: 1_800_000_000,
            },
        })
        .collect()
}

#[tokio::main]
async fn main() {
    let forks = arg("--forks", 100);
    let rounds = arg("--rounds", 5);
    let src = tempfile::tempdir().unwrap();
    repo::create(src.path()).unwrap();
    let http = GitHttp::serve(src.path(), "forkyard", "bench-token");
    let base = std::process::Command::new("git")
        .arg("--git-dir")
        .arg(http.repo())
        .args(["rev-parse", "HEAD"])
        .output()
        .unwrap();
    let base = String::from_utf8_lossy(&base.stdout).trim().to_owned();
    let basic = base64::engine::general_purpose::STANDARD.encode("forkyard:bench-token");
    let access = Access {
        url: http.url(),
        pin: Vec::new(),
        env: vec![
            ("GIT_CONFIG_COUNT".into(), "1".into()),
            (
                "GIT_CONFIG_KEY_0".into(),
                format!("http.http://127.0.0.1:{}/.extraHeader", http.port),
            ),
            (
                "GIT_CONFIG_VALUE_0".into(),
                format!("Authorization: Basic {basic}"),
            ),
        ],
    };
    let mut times: Vec<Duration> = Vec::new();
    let mut requests = 0;
    for round in 0..rounds {
        let before = http.requests().len();
        let started = Instant::now();
        let pushed = push::push(&access, &access, changes(forks, round, &base)).await;
        times.push(started.elapsed());
        requests = http.requests().len() - before;
        let failed: Vec<_> = pushed.iter().filter(|(_, r)| r.is_err()).collect();
        assert!(failed.is_empty(), "not pushed: {failed:?}");
        assert_eq!(pushed.len(), forks);
    }
    times.sort();
    let p50 = times[times.len() / 2];
    let max = times[times.len() - 1];
    println!(
        "delivery: {forks} forks' branches made and pushed: p50 {:.2} s, slowest {:.2} s over {rounds} rounds (target: under 5 s); {requests} HTTP requests to the server per delivery (one fetch, one push)",
        p50.as_secs_f64(),
        max.as_secs_f64()
    );
}
