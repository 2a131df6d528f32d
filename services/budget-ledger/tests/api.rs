//! The fuller API: tenant accounts, charges then commit, overage policy, overdraft,
//! postings paging, the spend report and bad input (SQLite or PostgreSQL, see `common`).

mod common;

use common::{assert_books_balance, store};
use forkyard_budget_ledger::{LedgerError, MAX_AMOUNT_MICROS};
use forkyard_proto::budget::v1::{
    AccountKind, Bucket, ChargeRequest, CommitOverage, CommitRequest, CreateAccountRequest,
    GetSpendReportRequest, ListPostingsRequest, ReleaseRequest, ReserveRequest, SpendAttribution,
    SpendGroupBy,
};
use tonic::Code;

fn account(id: &str, kind: AccountKind, parent: &str, budget: i64) -> CreateAccountRequest {
    CreateAccountRequest {
        account_id: id.into(),
        kind: kind as i32,
        parent_account_id: parent.into(),
        budget_micros: budget,
        idempotency_key: format!("create-{id}"),
        ..Default::default()
    }
}

fn reserve(acct: &str, amount: i64, key: &str) -> ReserveRequest {
    ReserveRequest {
        account_id: acct.into(),
        amount_micros: amount,
        holder: format!("{acct}/fork-1"),
        idempotency_key: key.into(),
    }
}

fn charge(rsv: &str, amount: i64, model: &str, key: &str) -> ChargeRequest {
    ChargeRequest {
        reservation_id: rsv.into(),
        amount_micros: amount,
        attribution: Some(SpendAttribution {
            model: model.into(),
            ..Default::default()
        }),
        idempotency_key: key.into(),
    }
}

fn commit(rsv: &str, amount: i64, key: &str) -> CommitRequest {
    CommitRequest {
        reservation_id: rsv.into(),
        amount_micros: amount,
        idempotency_key: key.into(),
    }
}

fn status(e: LedgerError) -> (Code, String) {
    let s = tonic::Status::from(e);
    (s.code(), s.message().to_owned())
}

#[tokio::test]
async fn runs_draw_on_their_tenant_and_charges_settle_on_commit() {
    let (_db, store) = store().await;
    store
        .create_account(&account("acme", AccountKind::Tenant, "", 1_000))
        .await
        .unwrap();
    store
        .create_account(&account("run-1", AccountKind::Run, "acme", 800))
        .await
        .unwrap();
    store
        .create_account(&account("run-2", AccountKind::Run, "acme", 800))
        .await
        .unwrap();
    let r1 = store.reserve(&reserve("run-1", 600, "r1")).await.unwrap();
    // run-2 has 800 of its own but the tenant only 400 left.
    let (c, msg) = status(
        store
            .reserve(&reserve("run-2", 500, "r2"))
            .await
            .unwrap_err(),
    );
    assert_eq!(c, Code::FailedPrecondition);
    assert!(msg.contains("\"acme\""), "{msg}");
    let r2 = store.reserve(&reserve("run-2", 400, "r2b")).await.unwrap();

    // Charges: 250 + 300 from the hold of 600, then a commit of the total 700 takes 100 of
    // run-1's available (tenant: 0 left after r2 → capped at 650).
    store
        .charge(&charge(&r1.reservation_id, 250, "opus", "c1"))
        .await
        .unwrap();
    let after = store
        .charge(&charge(&r1.reservation_id, 300, "haiku", "c2"))
        .await
        .unwrap();
    assert_eq!(after.charged_micros, 550);
    let (c, _) = status(
        store
            .commit(&commit(&r1.reservation_id, 500, "below"))
            .await
            .unwrap_err(),
    );
    assert_eq!(
        c,
        Code::FailedPrecondition,
        "a commit below the charges is refused"
    );
    let done = store
        .commit(&commit(&r1.reservation_id, 700, "k1"))
        .await
        .unwrap();
    assert_eq!((done.committed_micros, done.budget_exceeded), (600, true));
    store
        .release(&ReleaseRequest {
            reservation_id: r2.reservation_id.clone(),
            idempotency_key: "rel".into(),
        })
        .await
        .unwrap();
    let tenant = store.get_account("acme").await.unwrap();
    assert_eq!(
        (
            tenant.budget_micros,
            tenant.reserved_micros,
            tenant.spent_micros
        ),
        (1_000, 0, 600)
    );
    let run1 = store.get_account("run-1").await.unwrap();
    assert_eq!((run1.spent_micros, run1.available_micros), (600, 200));
    assert_eq!(run1.parent_account_id, "acme");

    let report = |group: SpendGroupBy, scope: &str| GetSpendReportRequest {
        account_id: scope.into(),
        group_by: group as i32,
        ..Default::default()
    };
    let by_model = store
        .spend_report(&report(SpendGroupBy::Model, "acme"))
        .await
        .unwrap();
    let rows: Vec<_> = by_model
        .rows
        .iter()
        .map(|r| (r.key.as_str(), r.spent_micros))
        .collect();
    assert_eq!(rows, [("", 50), ("haiku", 300), ("opus", 250)]);
    assert_eq!(by_model.total_spent_micros, 600);
    let by_tenant = store
        .spend_report(&report(SpendGroupBy::Tenant, ""))
        .await
        .unwrap();
    assert_eq!(by_tenant.rows[0].key, "acme");
    let by_fork = store
        .spend_report(&report(SpendGroupBy::Fork, "run-1"))
        .await
        .unwrap();
    assert_eq!(by_fork.rows[0].key, "run-1/fork-1");
    let future = GetSpendReportRequest {
        from_unix_ms: i64::MAX - 1,
        ..report(SpendGroupBy::Run, "")
    };
    assert_eq!(
        store
            .spend_report(&future)
            .await
            .unwrap()
            .total_spent_micros,
        0
    );
    assert_books_balance(&store).await;
}

#[tokio::test]
async fn overage_policy_overdraft_and_charges_beyond_the_hold() {
    let (_db, store) = store().await;
    let strict = CreateAccountRequest {
        commit_overage: CommitOverage::Reject as i32,
        ..account("strict", AccountKind::Run, "", 1_000)
    };
    store.create_account(&strict).await.unwrap();
    let r = store.reserve(&reserve("strict", 100, "r")).await.unwrap();
    let (c, msg) = status(
        store
            .commit(&commit(&r.reservation_id, 101, "c"))
            .await
            .unwrap_err(),
    );
    assert_eq!(c, Code::FailedPrecondition, "{msg}");
    // A charge beyond the hold takes available when it fits, else is refused whole.
    store
        .charge(&charge(&r.reservation_id, 150, "m", "ch1"))
        .await
        .unwrap();
    let err = store
        .charge(&charge(&r.reservation_id, 901, "m", "ch2"))
        .await
        .unwrap_err();
    assert!(matches!(err, LedgerError::BudgetExceeded(_)), "{err}");
    let acct = store.get_account("strict").await.unwrap();
    assert_eq!(
        (
            acct.reserved_micros,
            acct.spent_micros,
            acct.available_micros
        ),
        (0, 150, 850)
    );
    let done = store
        .commit(&commit(&r.reservation_id, 150, "c2"))
        .await
        .unwrap();
    assert_eq!((done.committed_micros, done.budget_exceeded), (150, false));

    let od = CreateAccountRequest {
        allow_overdraft: true,
        ..account("od", AccountKind::Run, "", 100)
    };
    store.create_account(&od).await.unwrap();
    let r = store.reserve(&reserve("od", 500, "r-od")).await.unwrap();
    let c = store
        .commit(&commit(&r.reservation_id, 700, "c-od"))
        .await
        .unwrap();
    assert_eq!((c.committed_micros, c.budget_exceeded), (700, true));
    assert_eq!(
        store.get_account("od").await.unwrap().available_micros,
        -600
    );
    assert_books_balance(&store).await;
}

#[tokio::test]
async fn postings_page_and_balance_per_transfer() {
    let (_db, store) = store().await;
    store
        .create_account(&account("p", AccountKind::Run, "", 10_000))
        .await
        .unwrap();
    let r = store.reserve(&reserve("p", 5_000, "r")).await.unwrap();
    for i in 0..20 {
        store
            .charge(&charge(&r.reservation_id, 10, "m", &format!("c{i}")))
            .await
            .unwrap();
    }
    let mut all = Vec::new();
    let mut token = String::new();
    loop {
        let page = store
            .list_postings(&ListPostingsRequest {
                account_id: "p".into(),
                page_size: 7,
                page_token: token,
            })
            .await
            .unwrap();
        assert!(page.postings.len() <= 7);
        all.extend(page.postings);
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    // fund 2 legs + reserve 2 + 20 charges × 2.
    assert_eq!(all.len(), 44);
    assert!(all.windows(2).all(|w| w[0].seq + 1 == w[1].seq));
    let spent: i64 = all
        .iter()
        .filter(|p| p.bucket() == Bucket::Spent)
        .map(|p| p.amount_micros)
        .sum();
    assert_eq!(spent, 200);
    let mut by_transfer = std::collections::BTreeMap::<_, i64>::new();
    for p in &all {
        *by_transfer.entry(p.transfer_id.clone()).or_default() += p.amount_micros;
    }
    assert!(by_transfer.values().all(|s| *s == 0));
    let bad = ListPostingsRequest {
        account_id: "p".into(),
        page_size: 5000,
        page_token: String::new(),
    };
    assert_eq!(
        status(store.list_postings(&bad).await.unwrap_err()).0,
        Code::InvalidArgument
    );
}

#[tokio::test]
async fn bad_input_is_refused_with_the_field_named_and_nothing_posted() {
    let (_db, store) = store().await;
    store
        .create_account(&account("t", AccountKind::Tenant, "", 100))
        .await
        .unwrap();
    store
        .create_account(&account("a", AccountKind::Run, "", 100))
        .await
        .unwrap();
    let r = store.reserve(&reserve("a", 50, "r")).await.unwrap();
    let cases: Vec<(Result<(), LedgerError>, Code, &str)> = vec![
        (
            store
                .charge(&charge(&r.reservation_id, 0, "m", "z"))
                .await
                .map(drop),
            Code::InvalidArgument,
            "amount_micros",
        ),
        (
            store
                .charge(&charge(&r.reservation_id, -3, "m", "n"))
                .await
                .map(drop),
            Code::InvalidArgument,
            "amount_micros",
        ),
        (
            store
                .charge(&charge("rsv-none", 3, "m", "u"))
                .await
                .map(drop),
            Code::NotFound,
            "rsv-none",
        ),
        (
            store
                .reserve(&reserve("a", MAX_AMOUNT_MICROS + 1, "big"))
                .await
                .map(drop),
            Code::InvalidArgument,
            "amount_micros",
        ),
        (
            store
                .reserve(&reserve("a", i64::MAX, "max"))
                .await
                .map(drop),
            Code::InvalidArgument,
            "amount_micros",
        ),
        (
            store
                .create_account(&account("x", AccountKind::Run, "a", 1))
                .await
                .map(drop),
            Code::FailedPrecondition,
            "parent_account_id",
        ),
        (
            store
                .create_account(&account("y", AccountKind::Run, "ghost", 1))
                .await
                .map(drop),
            Code::NotFound,
            "parent_account_id",
        ),
        (
            store
                .create_account(&account("z", AccountKind::Tenant, "t", 1))
                .await
                .map(drop),
            Code::InvalidArgument,
            "parent_account_id",
        ),
        (
            store
                .create_account(&CreateAccountRequest {
                    kind: 9,
                    ..account("w", AccountKind::Run, "", 1)
                })
                .await
                .map(drop),
            Code::InvalidArgument,
            "kind",
        ),
        (
            store
                .create_account(&CreateAccountRequest {
                    idempotency_key: "again".into(),
                    ..account("a", AccountKind::Tenant, "", 100)
                })
                .await
                .map(drop),
            Code::AlreadyExists,
            "already exists",
        ),
    ];
    for (result, want, needle) in cases {
        let (c, msg) = status(result.unwrap_err());
        assert_eq!(c, want, "{msg}");
        assert!(msg.contains(needle), "{msg:?} should mention {needle:?}");
    }
    store
        .commit(&commit(&r.reservation_id, 10, "c"))
        .await
        .unwrap();
    let twice = store
        .commit(&commit(&r.reservation_id, 10, "c-again"))
        .await
        .unwrap_err();
    assert_eq!(status(twice).0, Code::FailedPrecondition);
    let after_commit = ReleaseRequest {
        reservation_id: r.reservation_id.clone(),
        idempotency_key: "rel".into(),
    };
    assert_eq!(
        status(store.release(&after_commit).await.unwrap_err()).0,
        Code::FailedPrecondition
    );
    let acct = store.get_account("a").await.unwrap();
    assert_eq!(
        (
            acct.reserved_micros,
            acct.spent_micros,
            acct.available_micros
        ),
        (0, 10, 90)
    );
    assert_books_balance(&store).await;
}
