//! `make bench-ledger`: idempotent postings per second on the budget ledger, on one hot
//! account and across many accounts, with durable commits (SQLite WAL with
//! `synchronous = FULL`; PostgreSQL with `fsync = on`).
//!
//!   cargo bench -p forkyard-tests --bench ledger                 SQLite in a temp directory
//!   cargo bench -p forkyard-tests --bench ledger -- --postgres   the server in
//!       FORKYARD_TEST_POSTGRES_URL (run it under scripts/test-postgres.sh)
//!
//! Every posting is a `Charge` with its own idempotency key, sent by many concurrent
//! callers as the agent-runners would; the figures are printed, never asserted.

use forkyard_budget_ledger::LedgerStore;
use forkyard_proto::budget::v1::{ChargeRequest, CreateAccountRequest, ReserveRequest};
use std::{
    sync::Arc,
    time::{Duration, Instant},
};

const CALLERS: usize = 256;
const RUN_FOR: Duration = Duration::from_secs(4);

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let postgres = std::env::args().any(|a| a == "--postgres");
    let (_dir, url, label) = if postgres {
        let url = std::env::var("FORKYARD_TEST_POSTGRES_URL")
            .map_err(|_| anyhow::anyhow!("--postgres needs FORKYARD_TEST_POSTGRES_URL"))?;
        (None, url, "postgresql")
    } else {
        let dir = tempfile::tempdir()?;
        let url = format!("sqlite://{}", dir.path().join("bench.db").display());
        (Some(dir), url, "sqlite")
    };
    let store = Arc::new(LedgerStore::connect(&url).await?);
    for (scenario, accounts) in [("one hot account", 1), ("1000 accounts", 1000)] {
        let rate = run(&store, scenario, accounts).await?;
        println!(
            "ledger bench [{label}] {scenario}: {rate:.0} postings/s ({CALLERS} concurrent callers, durable commits)"
        );
    }
    let problems = store.audit().await?;
    anyhow::ensure!(problems.is_empty(), "books do not balance: {problems:?}");
    Ok(())
}

async fn run(store: &Arc<LedgerStore>, scenario: &str, accounts: usize) -> anyhow::Result<f64> {
    let tag = scenario.replace(' ', "-");
    let mut reservations = Vec::new();
    for a in 0..accounts {
        let account_id = format!("bench-{tag}-{a}");
        store
            .create_account(&CreateAccountRequest {
                account_id: account_id.clone(),
                budget_micros: 1_000_000_000_000,
                idempotency_key: format!("{account_id}/open"),
                ..Default::default()
            })
            .await?;
        let rsv = store
            .reserve(&ReserveRequest {
                account_id: account_id.clone(),
                amount_micros: 500_000_000_000,
                holder: "bench".into(),
                idempotency_key: format!("{account_id}/reserve"),
            })
            .await?;
        reservations.push(rsv.reservation_id);
    }
    let reservations = Arc::new(reservations);
    let start = Instant::now();
    let tasks: Vec<_> = (0..CALLERS)
        .map(|c| {
            let store = store.clone();
            let reservations = reservations.clone();
            let tag = tag.clone();
            tokio::spawn(async move {
                let mut n = 0u64;
                while start.elapsed() < RUN_FOR {
                    let rsv = &reservations[(c + n as usize * CALLERS) % reservations.len()];
                    store
                        .charge(&ChargeRequest {
                            reservation_id: rsv.clone(),
                            amount_micros: 1 + (n % 7) as i64,
                            attribution: None,
                            idempotency_key: format!("{tag}/caller-{c}/charge-{n}"),
                        })
                        .await?;
                    n += 1;
                }
                anyhow::Ok(n)
            })
        })
        .collect();
    let mut total = 0;
    for t in tasks {
        total += t.await??;
    }
    Ok(total as f64 / start.elapsed().as_secs_f64())
}
