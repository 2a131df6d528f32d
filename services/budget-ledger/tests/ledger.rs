//! The ledger's original behaviour (the workflows depend on it), against SQLite or
//! PostgreSQL (see `common`).

mod common;

use forkyard_budget_ledger::{LedgerError, LedgerService, LedgerStore};
use forkyard_proto::budget::v1::{
    Account, CommitRequest, GetAccountRequest, ListReservationsRequest, OpenAccountRequest,
    RaiseBudgetRequest, ReleaseRequest, Reservation, ReservationState, ReserveRequest,
    budget_ledger_client::BudgetLedgerClient,
};
use std::sync::Arc;
use tonic::Code;

use common::store;

async fn open(store: &LedgerStore, id: &str, budget: i64) -> Account {
    store
        .open_account(&OpenAccountRequest {
            account_id: id.into(),
            budget_micros: budget,
            idempotency_key: format!("open-{id}"),
        })
        .await
        .unwrap()
}

fn reserve_req(account: &str, amount: i64, key: &str) -> ReserveRequest {
    ReserveRequest {
        account_id: account.into(),
        amount_micros: amount,
        holder: "wf-fork-1".into(),
        idempotency_key: key.into(),
    }
}

fn commit_req(rsv: &Reservation, amount: i64, key: &str) -> CommitRequest {
    CommitRequest {
        reservation_id: rsv.reservation_id.clone(),
        amount_micros: amount,
        idempotency_key: key.into(),
    }
}

fn release_req(rsv: &Reservation, key: &str) -> ReleaseRequest {
    ReleaseRequest {
        reservation_id: rsv.reservation_id.clone(),
        idempotency_key: key.into(),
    }
}

fn balances(a: &Account) -> (i64, i64, i64, i64) {
    (
        a.budget_micros,
        a.reserved_micros,
        a.spent_micros,
        a.available_micros,
    )
}

fn code(e: LedgerError) -> (Code, String) {
    let s = tonic::Status::from(e);
    (s.code(), s.message().to_owned())
}

#[tokio::test]
async fn reserve_commit_release_flow_and_balances() {
    let (_dir, store) = store().await;
    let acct = open(&store, "run-1", 1_000).await;
    assert_eq!(balances(&acct), (1_000, 0, 0, 1_000));

    let r1 = store
        .reserve(&reserve_req("run-1", 300, "r1"))
        .await
        .unwrap();
    assert!(
        r1.reservation_id.starts_with("rsv-"),
        "{}",
        r1.reservation_id
    );
    assert_eq!(r1.state(), ReservationState::Held);
    assert_eq!((r1.amount_micros, r1.holder.as_str()), (300, "wf-fork-1"));
    assert_eq!(
        balances(&store.get_account("run-1").await.unwrap()),
        (1_000, 300, 0, 700)
    );

    let c1 = store.commit(&commit_req(&r1, 200, "c1")).await.unwrap();
    assert_eq!(c1.state(), ReservationState::Committed);
    assert_eq!((c1.committed_micros, c1.budget_exceeded), (200, false));
    assert_eq!(
        balances(&store.get_account("run-1").await.unwrap()),
        (1_000, 0, 200, 800)
    );

    let r2 = store
        .reserve(&reserve_req("run-1", 100, "r2"))
        .await
        .unwrap();
    assert_eq!(
        balances(&store.get_account("run-1").await.unwrap()),
        (1_000, 100, 200, 700)
    );
    let rel = store.release(&release_req(&r2, "rel2")).await.unwrap();
    assert_eq!(rel.state(), ReservationState::Released);
    assert_eq!(
        balances(&store.get_account("run-1").await.unwrap()),
        (1_000, 0, 200, 800)
    );
    // Releasing a released reservation under a new key is refused (the same key replays).
    let again = store
        .release(&release_req(&r2, "rel2-again"))
        .await
        .unwrap_err();
    assert_eq!(code(again).0, Code::FailedPrecondition);
    assert_eq!(store.release(&release_req(&r2, "rel2")).await.unwrap(), rel);

    let r3 = store
        .reserve(&reserve_req("run-1", 50, "r3"))
        .await
        .unwrap();
    let list = |state: ReservationState| ListReservationsRequest {
        account_id: "run-1".into(),
        state: state as i32,
    };
    let all = store
        .list_reservations(&list(ReservationState::Unspecified))
        .await
        .unwrap();
    assert_eq!(all.len(), 3);
    let held = store
        .list_reservations(&list(ReservationState::Held))
        .await
        .unwrap();
    assert_eq!(
        held.iter()
            .map(|r| r.reservation_id.as_str())
            .collect::<Vec<_>>(),
        [r3.reservation_id.as_str()]
    );
    let committed = store
        .list_reservations(&list(ReservationState::Committed))
        .await
        .unwrap();
    assert_eq!(committed, vec![c1]);
    let released = store
        .list_reservations(&list(ReservationState::Released))
        .await
        .unwrap();
    assert_eq!(released, vec![rel]);
}

#[tokio::test]
async fn raising_the_budget_makes_room_for_a_refused_reservation_once() {
    let (_dir, store) = store().await;
    open(&store, "run-raise", 100).await;
    store
        .reserve(&reserve_req("run-raise", 80, "r1"))
        .await
        .unwrap();
    let refused = store
        .reserve(&reserve_req("run-raise", 50, "r2"))
        .await
        .unwrap_err();
    assert_eq!(code(refused).0, Code::FailedPrecondition);

    let raise = RaiseBudgetRequest {
        account_id: "run-raise".into(),
        amount_micros: 30,
        idempotency_key: "raise-1".into(),
    };
    let raised = store.raise_budget(&raise).await.unwrap();
    assert_eq!(balances(&raised), (130, 80, 0, 50));
    // A replayed raise (a Temporal retry) adds nothing.
    assert_eq!(store.raise_budget(&raise).await.unwrap(), raised);
    assert_eq!(
        balances(&store.get_account("run-raise").await.unwrap()),
        (130, 80, 0, 50)
    );
    store
        .reserve(&reserve_req("run-raise", 50, "r3"))
        .await
        .unwrap();

    for bad in [0, -5] {
        let req = RaiseBudgetRequest {
            amount_micros: bad,
            idempotency_key: format!("bad{bad}"),
            ..raise.clone()
        };
        let (c, msg) = code(store.raise_budget(&req).await.unwrap_err());
        assert_eq!(c, Code::InvalidArgument);
        assert!(msg.contains("amount_micros"), "{msg}");
    }
    let unknown = RaiseBudgetRequest {
        account_id: "nope".into(),
        idempotency_key: "u".into(),
        ..raise
    };
    assert_eq!(
        code(store.raise_budget(&unknown).await.unwrap_err()).0,
        Code::NotFound
    );
}

#[tokio::test]
async fn every_mutating_call_replays_once_with_the_same_response() {
    let (_dir, store) = store().await;
    let open_req = OpenAccountRequest {
        account_id: "a".into(),
        budget_micros: 1_000,
        idempotency_key: "k-open".into(),
    };
    let first = store.open_account(&open_req).await.unwrap();
    assert_eq!(store.open_account(&open_req).await.unwrap(), first);
    // Opening again with the same budget under a new key returns the account too.
    let other_key = OpenAccountRequest {
        idempotency_key: "k-open-2".into(),
        ..open_req.clone()
    };
    assert_eq!(store.open_account(&other_key).await.unwrap(), first);

    let req = reserve_req("a", 400, "k-rsv");
    let rsv = store.reserve(&req).await.unwrap();
    for _ in 0..3 {
        assert_eq!(store.reserve(&req).await.unwrap(), rsv);
    }
    assert_eq!(
        balances(&store.get_account("a").await.unwrap()),
        (1_000, 400, 0, 600)
    );

    let commit = commit_req(&rsv, 250, "k-commit");
    let committed = store.commit(&commit).await.unwrap();
    assert_eq!(store.commit(&commit).await.unwrap(), committed);
    assert_eq!(
        balances(&store.get_account("a").await.unwrap()),
        (1_000, 0, 250, 750)
    );

    // Replaying the reserve returns what it returned then (HELD), and posts nothing.
    let replayed = store.reserve(&req).await.unwrap();
    assert_eq!(replayed.state(), ReservationState::Held);
    assert_eq!(replayed, rsv);
    assert_eq!(
        balances(&store.get_account("a").await.unwrap()),
        (1_000, 0, 250, 750)
    );

    let rsv2 = store
        .reserve(&reserve_req("a", 100, "k-rsv2"))
        .await
        .unwrap();
    let release = release_req(&rsv2, "k-release");
    let released = store.release(&release).await.unwrap();
    assert_eq!(store.release(&release).await.unwrap(), released);
    assert_eq!(
        balances(&store.get_account("a").await.unwrap()),
        (1_000, 0, 250, 750)
    );
    let all = ListReservationsRequest {
        account_id: "a".into(),
        state: 0,
    };
    assert_eq!(store.list_reservations(&all).await.unwrap().len(), 2);
}

#[tokio::test]
async fn idempotency_key_reused_with_other_parameters_is_refused() {
    let (_dir, store) = store().await;
    open(&store, "a", 1_000).await;
    let rsv = store.reserve(&reserve_req("a", 100, "k")).await.unwrap();

    let (c, msg) = code(
        store
            .reserve(&reserve_req("a", 101, "k"))
            .await
            .unwrap_err(),
    );
    assert_eq!(c, Code::InvalidArgument);
    assert!(
        msg.contains("idempotency key reused with different parameters"),
        "{msg}"
    );
    // The same key on another operation is a reuse too.
    let (c, msg) = code(store.commit(&commit_req(&rsv, 100, "k")).await.unwrap_err());
    assert_eq!(c, Code::InvalidArgument, "{msg}");
    let (c, _) = code(
        store
            .open_account(&OpenAccountRequest {
                account_id: "a".into(),
                budget_micros: 1_000,
                idempotency_key: "k".into(),
            })
            .await
            .unwrap_err(),
    );
    assert_eq!(c, Code::InvalidArgument);
    // Nothing was posted by the refused calls.
    assert_eq!(
        balances(&store.get_account("a").await.unwrap()),
        (1_000, 100, 0, 900)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_reserves_never_exceed_the_budget() {
    let (_dir, store) = store().await;
    let store = Arc::new(store);
    open(&store, "shared", 1_000).await;
    let tasks: Vec<_> = (0..50)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move {
                store
                    .reserve(&reserve_req("shared", 30 + (i % 3), &format!("k-{i}")))
                    .await
            })
        })
        .collect();
    let mut granted = 0;
    let mut refused = 0;
    for t in tasks {
        match t.await.unwrap() {
            Ok(r) => granted += r.amount_micros,
            Err(LedgerError::BudgetExceeded(_)) => refused += 1,
            Err(e) => panic!("unexpected error: {e}"),
        }
    }
    assert!(granted <= 1_000, "granted {granted}");
    assert!(refused > 0, "50 reserves of ~31 must not all fit in 1000");
    let acct = store.get_account("shared").await.unwrap();
    assert_eq!(acct.reserved_micros, granted);
    assert_eq!(acct.available_micros, 1_000 - granted);
    assert!(
        acct.available_micros < 30,
        "left {} unreserved",
        acct.available_micros
    );
}

#[tokio::test]
async fn commit_above_reservation_takes_available_then_caps() {
    let (_dir, store) = store().await;
    open(&store, "a", 1_000).await;
    let r1 = store.reserve(&reserve_req("a", 400, "r1")).await.unwrap();
    let r2 = store.reserve(&reserve_req("a", 400, "r2")).await.unwrap();
    // 200 left: a commit of 550 on r1 takes 150 of it.
    let c1 = store.commit(&commit_req(&r1, 550, "c1")).await.unwrap();
    assert_eq!((c1.committed_micros, c1.budget_exceeded), (550, false));
    assert_eq!(
        balances(&store.get_account("a").await.unwrap()),
        (1_000, 400, 550, 50)
    );
    // r2 asks for 600 but only 400 + 50 exist: capped, flagged.
    let c2 = store.commit(&commit_req(&r2, 600, "c2")).await.unwrap();
    assert_eq!((c2.committed_micros, c2.budget_exceeded), (450, true));
    assert_eq!(
        balances(&store.get_account("a").await.unwrap()),
        (1_000, 0, 1_000, 0)
    );
    // Committing less than reserved returns the rest.
    let (_d, store) = self::store().await;
    open(&store, "b", 100).await;
    let r = store.reserve(&reserve_req("b", 100, "r")).await.unwrap();
    store.commit(&commit_req(&r, 0, "c")).await.unwrap();
    assert_eq!(
        balances(&store.get_account("b").await.unwrap()),
        (100, 0, 0, 100)
    );
}

#[tokio::test]
async fn bad_input_and_preconditions_map_to_codes() {
    let (_dir, store) = store().await;
    open(&store, "a", 100).await;

    let cases: Vec<(LedgerError, Code, &str)> = vec![
        (
            store.reserve(&reserve_req("a", 10, "")).await.unwrap_err(),
            Code::InvalidArgument,
            "idempotency_key",
        ),
        (
            store.reserve(&reserve_req("a", 0, "k0")).await.unwrap_err(),
            Code::InvalidArgument,
            "amount_micros",
        ),
        (
            store
                .reserve(&reserve_req("a", -5, "k1"))
                .await
                .unwrap_err(),
            Code::InvalidArgument,
            "amount_micros",
        ),
        (
            store.reserve(&reserve_req("", 5, "k2")).await.unwrap_err(),
            Code::InvalidArgument,
            "account_id",
        ),
        (
            store
                .reserve(&reserve_req("nope", 5, "k3"))
                .await
                .unwrap_err(),
            Code::NotFound,
            "nope",
        ),
        (
            store
                .reserve(&reserve_req("a", 101, "k4"))
                .await
                .unwrap_err(),
            Code::FailedPrecondition,
            "budget exceeded",
        ),
        (
            store
                .open_account(&OpenAccountRequest {
                    account_id: "b".into(),
                    budget_micros: -1,
                    idempotency_key: "k5".into(),
                })
                .await
                .unwrap_err(),
            Code::InvalidArgument,
            "budget_micros",
        ),
        (
            store
                .open_account(&OpenAccountRequest {
                    account_id: "a".into(),
                    budget_micros: 5,
                    idempotency_key: "k6".into(),
                })
                .await
                .unwrap_err(),
            Code::AlreadyExists,
            "already exists",
        ),
        (
            store.get_account("").await.unwrap_err(),
            Code::InvalidArgument,
            "account_id",
        ),
        (
            store.get_account("ghost").await.unwrap_err(),
            Code::NotFound,
            "ghost",
        ),
        (
            store
                .commit(&CommitRequest {
                    reservation_id: "".into(),
                    amount_micros: 1,
                    idempotency_key: "k7".into(),
                })
                .await
                .unwrap_err(),
            Code::InvalidArgument,
            "reservation_id",
        ),
        (
            store
                .commit(&CommitRequest {
                    reservation_id: "rsv-x".into(),
                    amount_micros: 1,
                    idempotency_key: "k8".into(),
                })
                .await
                .unwrap_err(),
            Code::NotFound,
            "rsv-x",
        ),
    ];
    for (err, want, needle) in cases {
        let (c, msg) = code(err);
        assert_eq!(c, want, "{msg}");
        assert!(msg.contains(needle), "{msg:?} should mention {needle:?}");
    }

    let r = store.reserve(&reserve_req("a", 10, "r")).await.unwrap();
    let (c, msg) = code(store.commit(&commit_req(&r, -1, "neg")).await.unwrap_err());
    assert_eq!(c, Code::InvalidArgument);
    assert!(msg.contains("amount_micros"), "{msg}");
    store.commit(&commit_req(&r, 10, "c")).await.unwrap();
    let (c, msg) = code(
        store
            .commit(&commit_req(&r, 10, "c-other"))
            .await
            .unwrap_err(),
    );
    assert_eq!(c, Code::FailedPrecondition, "{msg}");
    let (c, msg) = code(store.release(&release_req(&r, "rel")).await.unwrap_err());
    assert_eq!(c, Code::FailedPrecondition, "{msg}");
    let (c, _) = code(store.release(&release_req(&r, "")).await.unwrap_err());
    assert_eq!(c, Code::InvalidArgument);
}

#[tokio::test]
async fn activity_errors_carry_the_workflow_error_types() {
    use forkyard_proto::activities::errors;
    let (_dir, store) = store().await;
    open(&store, "a", 10).await;
    let over = store.reserve(&reserve_req("a", 11, "k")).await.unwrap_err();
    let dbg = format!("{:?}", over.into_activity_error());
    assert!(dbg.contains(errors::BUDGET_EXCEEDED), "{dbg}");
    let bad = store.reserve(&reserve_req("a", 0, "k")).await.unwrap_err();
    let dbg = format!("{:?}", bad.into_activity_error());
    assert!(dbg.contains(errors::INVALID_INPUT), "{dbg}");
}

#[tokio::test]
async fn state_survives_reopening_the_database() {
    let db = common::TestDb::new().await;
    let rsv = {
        let store = db.open().await;
        open(&store, "a", 500).await;
        let r = store.reserve(&reserve_req("a", 200, "r")).await.unwrap();
        store.pool().close().await;
        r
    };
    let store = db.open().await;
    assert_eq!(
        balances(&store.get_account("a").await.unwrap()),
        (500, 200, 0, 300)
    );
    assert_eq!(
        store.reserve(&reserve_req("a", 200, "r")).await.unwrap(),
        rsv
    );
}

#[tokio::test]
async fn grpc_service_maps_errors_to_status_codes() {
    let (_dir, store) = store().await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let routes = tonic::service::Routes::new(LedgerService::new(Arc::new(store)).into_server());
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(forkyard_common::server::serve(
        listener,
        routes,
        async move {
            let _ = stop_rx.await;
        },
    ));

    let mut client = BudgetLedgerClient::connect(format!("http://{addr}"))
        .await
        .unwrap();
    let acct = client
        .open_account(OpenAccountRequest {
            account_id: "g".into(),
            budget_micros: 100,
            idempotency_key: "o".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(acct.available_micros, 100);
    let err = client
        .reserve(reserve_req("g", 101, "r"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    assert!(
        err.message().starts_with("budget exceeded"),
        "{}",
        err.message()
    );
    let err = client
        .get_account(GetAccountRequest {
            account_id: "nope".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    let err = client.reserve(reserve_req("g", 1, "")).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(
        err.message().contains("idempotency_key"),
        "{}",
        err.message()
    );

    let _ = stop_tx.send(());
    server.await.unwrap().unwrap();
}

#[test]
fn activities_are_registered_under_the_contract_names() {
    use forkyard_budget_ledger::activities::LedgerActivities;
    assert_eq!(LedgerActivities::open_account.name(), "ledger.open_account");
    assert_eq!(LedgerActivities::reserve.name(), "ledger.reserve");
    assert_eq!(LedgerActivities::commit.name(), "ledger.commit");
    assert_eq!(LedgerActivities::release.name(), "ledger.release");
}
