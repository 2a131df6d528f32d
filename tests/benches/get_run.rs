//! Run reads under load on the local stack (Temporal dev server + the five release
//! binaries): GetRun at a fixed rate from many clients, mixed with ListRuns, over runs
//! that finished and runs still running.
//!
//! Prints GetRun's and ListRuns' p50/p90/p99/max latency and their errors by status
//! code. The target (issue 21): GetRun p99 under 50 ms at 200 calls/s. Open loop: a call
//! starts every 1/rate s whatever the earlier ones do, so a stall shows as latency, not
//! as a lower rate. Settings: `FORKYARD_BENCH_RATE` (calls/s, default 200),
//! `FORKYARD_BENCH_SECS` (default 20), `FORKYARD_BENCH_CLIENTS` (connections, default
//! 64), `FORKYARD_BENCH_RUNS` (runs of each kind, default 10). The gateway's tenant
//! limits are raised to four times the rate (see `FORKYARD_TENANT_RATE`).

use forkyard_proto::gateway::v1::{GetRunRequest, ListRunsRequest};
use forkyard_tests::{
    Mesh,
    mesh::MeshOptions,
    repo,
    support::{Gateway, launch, run_to_end},
};
use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

fn env_num(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(default)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

#[derive(Default)]
struct Tally {
    ok: Vec<Duration>,
    errors: BTreeMap<String, usize>,
}

impl Tally {
    fn print(&mut self, what: &str) {
        self.ok.sort();
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        println!(
            "{what:<9} ok {:>6}  p50 {:>7.1} ms  p90 {:>7.1} ms  p99 {:>7.1} ms  max {:>7.1} ms  errors {:?}",
            self.ok.len(),
            ms(percentile(&self.ok, 0.50)),
            ms(percentile(&self.ok, 0.90)),
            ms(percentile(&self.ok, 0.99)),
            ms(self.ok.last().copied().unwrap_or_default()),
            self.errors,
        );
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let rate = env_num("FORKYARD_BENCH_RATE", 200).max(1);
    let secs = env_num("FORKYARD_BENCH_SECS", 20).max(1);
    let clients = env_num("FORKYARD_BENCH_CLIENTS", 64).max(1) as usize;
    let runs_of_each = env_num("FORKYARD_BENCH_RUNS", 10).max(1) as u32;

    // One tenant reading at this rate: its admission limits (50 calls/s by default)
    // raised so the figures are the read path's, not the limiter's refusals.
    let limit = (rate * 4).to_string();
    let gateway_env = [
        ("FORKYARD_TENANT_RATE", limit.as_str()),
        ("FORKYARD_TENANT_BURST", limit.as_str()),
        ("FORKYARD_TENANT_CONCURRENCY", limit.as_str()),
    ];
    let mesh = Mesh::start_with(MeshOptions {
        service_env: gateway_env
            .iter()
            .map(|(k, v)| ("gateway".to_owned(), (*k).to_owned(), (*v).to_owned()))
            .collect(),
        ..MeshOptions::default()
    })
    .await?;
    let src = tempfile::tempdir()?;
    repo::create(src.path())?;
    let mut gw = Gateway::new(mesh.channel("gateway").await?);

    // Finished runs (their views come from history), then running ones (agents that
    // sleep past the measurement, so their views come from the live workflow).
    let mut run_ids = Vec::new();
    for i in 0..runs_of_each {
        let req = launch(src.path(), 2, 2, "true");
        let (id, _) = run_to_end(
            &mut gw,
            forkyard_proto::gateway::v1::LaunchRunRequest {
                request_id: format!("bench-get-run-done-{i}"),
                ..req
            },
            Duration::from_secs(120),
        )
        .await;
        run_ids.push(id);
    }
    let sleeper = format!("sleep {}", secs + 60);
    for i in 0..runs_of_each {
        let req = forkyard_proto::gateway::v1::LaunchRunRequest {
            request_id: format!("bench-get-run-live-{i}"),
            ..launch(src.path(), 2, 2, &sleeper)
        };
        run_ids.push(gw.launch_run(req).await?.into_inner().run_id);
    }
    tokio::time::sleep(Duration::from_secs(3)).await;

    let mut conns = Vec::new();
    for _ in 0..clients {
        conns.push(Gateway::new(mesh.channel("gateway").await?));
    }
    println!(
        "GetRun at {rate}/s (1 in 10 calls a ListRuns) for {secs} s from {clients} clients over {} finished and {} running runs",
        runs_of_each, runs_of_each
    );
    let get = Arc::new(Mutex::new(Tally::default()));
    let list = Arc::new(Mutex::new(Tally::default()));
    let interval = Duration::from_secs_f64(1.0 / rate as f64);
    let start = Instant::now();
    let total = rate * secs;
    let mut tasks = Vec::with_capacity(total as usize);
    for n in 0..total {
        let due = start + interval * u32::try_from(n)?;
        tokio::time::sleep_until(due.into()).await;
        let mut client = conns[n as usize % clients].clone();
        let run_id = run_ids[n as usize % run_ids.len()].clone();
        let (get, list) = (get.clone(), list.clone());
        tasks.push(tokio::spawn(async move {
            let began = Instant::now();
            let (tally, res) = if n % 10 == 9 {
                let req = ListRunsRequest {
                    page_size: 20,
                    ..Default::default()
                };
                (list, client.list_runs(req).await.map(|_| ()))
            } else {
                (
                    get,
                    client.get_run(GetRunRequest { run_id }).await.map(|_| ()),
                )
            };
            let took = began.elapsed();
            let mut t = tally.lock().unwrap();
            match res {
                Ok(()) => t.ok.push(took),
                Err(s) => *t.errors.entry(format!("{:?}", s.code())).or_default() += 1,
            }
        }));
    }
    for t in tasks {
        t.await?;
    }
    let wall = start.elapsed();
    println!(
        "sent {total} calls in {:.1} s ({:.0}/s)",
        wall.as_secs_f64(),
        total as f64 / wall.as_secs_f64()
    );
    get.lock().unwrap().print("GetRun");
    list.lock().unwrap().print("ListRuns");
    drop(mesh);
    Ok(())
}
