//! The run console (#46's goals), on the mesh of release binaries with the console in
//! front of its gateway:
//! - the run page of a 1,000-fork run, rendered: p50 and max of sequential GETs (the
//!   goal: under 300 ms);
//! - 50 open run pages (each an SSE stream the console feeds from one WatchRun) must not
//!   slow the gateway's gRPC: GetRun p50 / p99 at a fixed rate over a running run,
//!   without them and then with them open.
//!
//! Settings: `FORKYARD_BENCH_CONSOLE_FORKS` (1000), `FORKYARD_BENCH_CONSOLE_PAGES` (50),
//! `FORKYARD_BENCH_RATE` (GetRun calls/s, 100), `FORKYARD_BENCH_SECS` (10 per phase).

use forkyard_proto::gateway::v1::{GetRunRequest, LaunchRunRequest};
use forkyard_tests::{
    Mesh,
    mesh::MeshOptions,
    repo,
    support::{Gateway, launch, run_to_end},
};
use futures::StreamExt as _;
use std::{
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

fn env_num(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(default)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len().max(1) - 1) as f64 * p).round() as usize;
    sorted.get(i).copied().unwrap_or_default()
}

/// `n` sequential GETs of `url`: their latencies, sorted; every answer must be a 200.
async fn gets(http: &reqwest::Client, url: &str, n: usize) -> anyhow::Result<Vec<Duration>> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        let resp = http.get(url).send().await?;
        anyhow::ensure!(resp.status() == 200, "{url}: {}", resp.status());
        let body = resp.bytes().await?;
        out.push(t.elapsed());
        anyhow::ensure!(!body.is_empty(), "{url}: empty page");
    }
    out.sort();
    Ok(out)
}

/// GetRun of `run_id` at `rate` calls/s for `secs`, open loop: latencies, sorted, and
/// the calls that failed.
async fn get_run_load(gw: &Gateway, run_id: &str, rate: u64, secs: u64) -> (Vec<Duration>, usize) {
    let seen = Arc::new(Mutex::new((Vec::new(), 0usize)));
    let mut tasks = Vec::new();
    let interval = Duration::from_secs_f64(1.0 / rate as f64);
    let start = Instant::now();
    for n in 0..rate * secs {
        tokio::time::sleep_until((start + interval * n as u32).into()).await;
        let (mut gw, seen, id) = (gw.clone(), seen.clone(), run_id.to_owned());
        tasks.push(tokio::spawn(async move {
            let t = Instant::now();
            let ok = gw.get_run(GetRunRequest { run_id: id }).await.is_ok();
            let mut s = seen.lock().unwrap();
            if ok {
                s.0.push(t.elapsed());
            } else {
                s.1 += 1;
            }
        }));
    }
    futures::future::join_all(tasks).await;
    let mut s = seen.lock().unwrap();
    s.0.sort();
    (std::mem::take(&mut s.0), s.1)
}

/// `pages` run pages' live streams held open (each read as it comes) until dropped.
async fn open_pages(
    http: &reqwest::Client,
    url: &str,
    pages: usize,
) -> anyhow::Result<Vec<tokio::task::JoinHandle<()>>> {
    let mut held = Vec::new();
    for _ in 0..pages {
        let resp = http.get(url).send().await?;
        anyhow::ensure!(resp.status() == 200, "{url}: {}", resp.status());
        held.push(tokio::spawn(async move {
            let mut body = resp.bytes_stream();
            while let Some(Ok(_)) = body.next().await {}
        }));
    }
    Ok(held)
}

fn report(what: &str, lat: &[Duration], failed: usize) {
    println!(
        "  {what:<34} p50 {:>6.1} ms  p99 {:>6.1} ms  max {:>6.1} ms  failed {failed}",
        ms(percentile(lat, 0.5)),
        ms(percentile(lat, 0.99)),
        ms(lat.last().copied().unwrap_or_default()),
    );
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let forks = env_num("FORKYARD_BENCH_CONSOLE_FORKS", 1000) as u32;
    let pages = env_num("FORKYARD_BENCH_CONSOLE_PAGES", 50) as usize;
    let rate = env_num("FORKYARD_BENCH_RATE", 100).max(1);
    let secs = env_num("FORKYARD_BENCH_SECS", 10).max(1);
    // One tenant (no keys): its watch cap (32 by default) above the pages opened, and its
    // admission limits (50 calls/s) above the rate, so the figures are the read path's.
    let watches = (pages + 8).to_string();
    let limit = (rate * 4).to_string();
    let gateway_env = [
        ("FORKYARD_TENANT_WATCHES", watches.as_str()),
        ("FORKYARD_TENANT_RATE", limit.as_str()),
        ("FORKYARD_TENANT_BURST", limit.as_str()),
        ("FORKYARD_TENANT_CONCURRENCY", limit.as_str()),
    ];
    let mut mesh = Mesh::start_with(MeshOptions {
        service_env: gateway_env
            .iter()
            .map(|(k, v)| ("gateway".to_owned(), (*k).to_owned(), (*v).to_owned()))
            .collect(),
        ..MeshOptions::default()
    })
    .await?;
    let base = mesh.start_console().await?;
    let http = reqwest::Client::new();
    let src = tempfile::tempdir()?;
    repo::create(src.path())?;
    let mut gw = Gateway::new(mesh.channel("gateway").await?);

    println!("console benchmark: release binaries, the console in front of the gateway");
    let big = LaunchRunRequest {
        budget_usd: "100".into(),
        ..launch(src.path(), forks, forks.min(100), "true")
    };
    let (big_id, _) = run_to_end(&mut gw, big, Duration::from_secs(600)).await;
    let page = gets(&http, &format!("{base}/runs/{big_id}"), 20).await?;
    report(&format!("run page of {forks} forks, 20 GETs"), &page, 0);

    // A running run the pages watch (its forks sleep past the measurement).
    let sleeper = format!("sleep {}", 2 * secs + 60);
    let live_id = gw
        .launch_run(launch(src.path(), 4, 4, &sleeper))
        .await?
        .into_inner()
        .run_id;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (lat, failed) = get_run_load(&gw, &live_id, rate, secs).await;
    report(&format!("GetRun at {rate}/s, no pages open"), &lat, failed);
    let held = open_pages(&http, &format!("{base}/runs/{live_id}/events"), pages).await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (lat, failed) = get_run_load(&gw, &live_id, rate, secs).await;
    report(
        &format!("GetRun at {rate}/s, {pages} pages open"),
        &lat,
        failed,
    );
    for h in held {
        h.abort();
    }
    Ok(())
}
