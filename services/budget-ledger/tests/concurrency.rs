//! Exactly once under concurrency, retries and crashes (SQLite or PostgreSQL, see `common`).

mod common;

use common::{assert_books_balance, store};
use forkyard_budget_ledger::LedgerError;
use forkyard_proto::budget::v1::{
    ChargeRequest, CommitRequest, CreateAccountRequest, ReleaseRequest, ReserveRequest,
    SpendAttribution,
};
use std::sync::Arc;

fn create(id: &str, budget: i64) -> CreateAccountRequest {
    CreateAccountRequest {
        account_id: id.into(),
        budget_micros: budget,
        idempotency_key: format!("create-{id}"),
        ..Default::default()
    }
}

fn charge(rsv: &str, amount: i64, key: &str) -> ChargeRequest {
    ChargeRequest {
        reservation_id: rsv.into(),
        amount_micros: amount,
        attribution: Some(SpendAttribution {
            model: "m".into(),
            ..Default::default()
        }),
        idempotency_key: key.into(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_charges_never_overspend_and_sum_exactly() {
    let (_db, store) = store().await;
    let store = Arc::new(store);
    store.create_account(&create("hot", 10_000)).await.unwrap();
    let rsv = store
        .reserve(&ReserveRequest {
            account_id: "hot".into(),
            amount_micros: 4_000,
            holder: "fork-1".into(),
            idempotency_key: "rsv".into(),
        })
        .await
        .unwrap();
    // 400 charges of 1..=50 (10_200 in all) against a hold of 4_000 and 6_000 more available.
    let tasks: Vec<_> = (0..400)
        .map(|i| {
            let store = store.clone();
            let id = rsv.reservation_id.clone();
            tokio::spawn(async move {
                let amount = 1 + (i % 50);
                (
                    amount,
                    store.charge(&charge(&id, amount, &format!("c-{i}"))).await,
                )
            })
        })
        .collect();
    let (mut charged, mut refused) = (0, 0);
    for t in tasks {
        match t.await.unwrap() {
            (amount, Ok(_)) => charged += amount,
            (_, Err(LedgerError::BudgetExceeded(_))) => refused += 1,
            (_, Err(e)) => panic!("unexpected: {e}"),
        }
    }
    assert!(refused > 0, "10_200 cannot fit into 10_000");
    assert!(charged <= 10_000, "charged {charged}");
    let acct = store.get_account("hot").await.unwrap();
    assert_eq!(acct.spent_micros, charged);
    assert_eq!(acct.reserved_micros, 0, "the hold is used up first");
    assert_eq!(acct.available_micros, 10_000 - charged);
    assert!(acct.available_micros < 50, "left {}", acct.available_micros);
    let r = store.get_reservation(&rsv.reservation_id).await.unwrap();
    assert_eq!(r.charged_micros, charged);
    assert_books_balance(&store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_same_key_sent_concurrently_posts_once() {
    let (_db, store) = store().await;
    let store = Arc::new(store);
    store.create_account(&create("a", 1_000)).await.unwrap();
    let reserve = ReserveRequest {
        account_id: "a".into(),
        amount_micros: 300,
        holder: "wf".into(),
        idempotency_key: "wf/reserve".into(),
    };
    let tasks: Vec<_> = (0..32)
        .map(|_| {
            let (store, req) = (store.clone(), reserve.clone());
            tokio::spawn(async move { store.reserve(&req).await.unwrap() })
        })
        .collect();
    let mut results = Vec::new();
    for t in tasks {
        results.push(t.await.unwrap());
    }
    assert!(
        results.windows(2).all(|w| w[0] == w[1]),
        "every caller sees one reservation"
    );
    let rsv = &results[0];
    let ch = charge(&rsv.reservation_id, 70, "wf/charge-1");
    let commit = CommitRequest {
        reservation_id: rsv.reservation_id.clone(),
        amount_micros: 250,
        idempotency_key: "wf/commit".into(),
    };
    let tasks: Vec<_> = (0..16)
        .map(|_| {
            let (store, ch) = (store.clone(), ch.clone());
            tokio::spawn(async move { store.charge(&ch).await.unwrap() })
        })
        .collect();
    for t in tasks {
        assert_eq!(t.await.unwrap().charged_micros, 70);
    }
    let tasks: Vec<_> = (0..16)
        .map(|_| {
            let (store, c) = (store.clone(), commit.clone());
            tokio::spawn(async move { store.commit(&c).await.unwrap() })
        })
        .collect();
    for t in tasks {
        assert_eq!(t.await.unwrap().committed_micros, 250);
    }
    let acct = store.get_account("a").await.unwrap();
    assert_eq!(
        (
            acct.reserved_micros,
            acct.spent_micros,
            acct.available_micros
        ),
        (0, 250, 750)
    );
    assert_books_balance(&store).await;
}

/// Calls dropped at random points (a worker killed mid-activity) and the database
/// reopened (the service restarted): Temporal's retry with the same key posts once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_retry_after_a_crash_posts_once() {
    let db = common::TestDb::new().await;
    let store = Arc::new(db.open().await);
    store.create_account(&create("a", 100_000)).await.unwrap();
    let rsv = store
        .reserve(&ReserveRequest {
            account_id: "a".into(),
            amount_micros: 50_000,
            holder: "wf".into(),
            idempotency_key: "wf/reserve".into(),
        })
        .await
        .unwrap();
    for i in 0..40u64 {
        let (store, id) = (store.clone(), rsv.reservation_id.clone());
        let call =
            tokio::spawn(async move { store.charge(&charge(&id, 10, &format!("k-{i}"))).await });
        tokio::time::sleep(std::time::Duration::from_micros(i * 50)).await;
        call.abort();
        let _ = call.await;
    }
    // The "process" dies: the pool closes; a new one opens the same database.
    store.pool().close().await;
    let store = db.open().await;
    for i in 0..40u64 {
        store
            .charge(&charge(&rsv.reservation_id, 10, &format!("k-{i}")))
            .await
            .unwrap();
        // And once more, as a retry whose first answer was lost.
        store
            .charge(&charge(&rsv.reservation_id, 10, &format!("k-{i}")))
            .await
            .unwrap();
    }
    let acct = store.get_account("a").await.unwrap();
    assert_eq!(
        acct.spent_micros, 400,
        "40 keys of 10 each, each posted once"
    );
    let released = store
        .release(&ReleaseRequest {
            reservation_id: rsv.reservation_id.clone(),
            idempotency_key: "wf/release".into(),
        })
        .await
        .unwrap();
    assert_eq!(
        released.committed_micros, 400,
        "charges stay spent after a release"
    );
    let acct = store.get_account("a").await.unwrap();
    assert_eq!(
        (
            acct.reserved_micros,
            acct.spent_micros,
            acct.available_micros
        ),
        (0, 400, 99_600)
    );
    assert_books_balance(&store).await;
}
