//! The store the tests run against: a SQLite file in a temporary directory, or, when
//! `FORKYARD_TEST_POSTGRES_URL` is set (`make test` does, see scripts/test-postgres.sh),
//! a fresh database on that PostgreSQL server for every test.
#![allow(dead_code)]

use forkyard_budget_ledger::LedgerStore;
use sqlx::{Connection, Executor};

pub const POSTGRES_ENV: &str = "FORKYARD_TEST_POSTGRES_URL";

/// One test's database; keeps the SQLite directory alive.
pub struct TestDb {
    pub url: String,
    _dir: Option<tempfile::TempDir>,
}

impl TestDb {
    pub async fn new() -> Self {
        match std::env::var(POSTGRES_ENV) {
            Ok(admin) if !admin.is_empty() => {
                let name = format!("ledger_test_{}", uuid_like());
                let mut conn = sqlx::PgConnection::connect(&admin)
                    .await
                    .unwrap_or_else(|e| panic!("{POSTGRES_ENV}={admin}: {e}"));
                conn.execute(format!("CREATE DATABASE {name}").as_str())
                    .await
                    .unwrap();
                let (base, query) = match admin.split_once('?') {
                    Some((b, q)) => (b, format!("?{q}")),
                    None => (admin.as_str(), String::new()),
                };
                let base = base.rsplit_once('/').map_or(base, |(b, _)| b);
                Self {
                    url: format!("{base}/{name}{query}"),
                    _dir: None,
                }
            }
            _ => {
                let dir = tempfile::tempdir().unwrap();
                Self {
                    url: format!("sqlite://{}", dir.path().join("ledger.db").display()),
                    _dir: Some(dir),
                }
            }
        }
    }

    pub async fn open(&self) -> LedgerStore {
        LedgerStore::connect(&self.url).await.unwrap()
    }
}

fn uuid_like() -> String {
    use std::time::{SystemTime, UNIX_EPOCH};
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let t = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("{}_{}_{}", std::process::id(), t % 1_000_000_000_000, n)
}

/// A store on a fresh database.
pub async fn store() -> (TestDb, LedgerStore) {
    let db = TestDb::new().await;
    let store = db.open().await;
    (db, store)
}

/// Panics when the books do not balance.
pub async fn assert_books_balance(store: &LedgerStore) {
    let problems = store.audit().await.unwrap();
    assert!(problems.is_empty(), "audit: {problems:#?}");
}
