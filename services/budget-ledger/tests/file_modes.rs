//! The ledger's SQLite database holds every fork's spending: it and the `-wal` and
//! `-shm` files beside it (where the data lands first) are readable by their owner only,
//! under the usual umask of 022 too; one an earlier version left readable is narrowed.

use forkyard_budget_ledger::LedgerStore;
use forkyard_proto::budget::v1::OpenAccountRequest;
use std::{os::unix::fs::PermissionsExt, path::Path};

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o777
}

async fn open_with_an_account(db: &Path) -> LedgerStore {
    let store = LedgerStore::open_file(db).await.unwrap();
    store
        .open_account(&OpenAccountRequest {
            account_id: "run-1".into(),
            budget_micros: 1_000,
            idempotency_key: "open-run-1".into(),
        })
        .await
        .unwrap();
    store
}

#[tokio::test]
async fn the_database_and_its_wal_are_their_owners_only() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("ledger.db");
    let store = open_with_an_account(&db).await;
    for name in ["ledger.db", "ledger.db-wal", "ledger.db-shm"] {
        let p = dir.path().join(name);
        assert!(p.exists(), "{name} missing");
        assert_eq!(mode(&p), 0o600, "{name}");
    }
    drop(store);

    // A database left world-readable before is narrowed when the ledger opens it.
    std::fs::set_permissions(&db, std::fs::Permissions::from_mode(0o644)).unwrap();
    let _store = open_with_an_account(&db).await;
    assert_eq!(mode(&db), 0o600);
}
