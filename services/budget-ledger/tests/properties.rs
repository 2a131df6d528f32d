//! Random sequences of ledger operations keep the books right: every transfer balances,
//! available = budget - reserved - spent >= 0, and the totals match a simple model.

mod common;

use forkyard_budget_ledger::LedgerError;
use forkyard_proto::budget::v1::{
    AccountKind, ChargeRequest, CommitRequest, CreateAccountRequest, RaiseBudgetRequest,
    ReleaseRequest, ReserveRequest,
};
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Step {
    Raise(usize, i64),
    Reserve(usize, i64),
    Charge(usize, i64),
    Commit(usize, i64),
    Release(usize),
    /// Replay the step at this index (a Temporal retry).
    Replay(usize),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        (0..3usize, 1..500i64).prop_map(|(a, x)| Step::Raise(a, x)),
        (0..2usize, 1..800i64).prop_map(|(a, x)| Step::Reserve(a, x)),
        (0..8usize, 1..400i64).prop_map(|(r, x)| Step::Charge(r, x)),
        (0..8usize, 0..900i64).prop_map(|(r, x)| Step::Commit(r, x)),
        (0..8usize).prop_map(Step::Release),
        (0..40usize).prop_map(Step::Replay),
    ]
}

async fn apply(
    store: &forkyard_budget_ledger::LedgerStore,
    steps: &[Step],
    i: usize,
    rsvs: &mut Vec<String>,
    fixed: Option<String>,
) -> Result<Option<String>, LedgerError> {
    let key = format!("k-{i}");
    let pick = |r: &usize, rsvs: &Vec<String>| {
        fixed
            .clone()
            .unwrap_or_else(|| rsvs[r % rsvs.len()].clone())
    };
    let accounts = ["run-a", "run-b", "tenant"];
    match &steps[i] {
        Step::Raise(a, x) => store
            .raise_budget(&RaiseBudgetRequest {
                account_id: accounts[*a].into(),
                amount_micros: *x,
                idempotency_key: key,
            })
            .await
            .map(|_| Some(String::new())),
        Step::Reserve(a, x) => {
            let r = store
                .reserve(&ReserveRequest {
                    account_id: accounts[*a].into(),
                    amount_micros: *x,
                    holder: format!("fork-{a}"),
                    idempotency_key: key,
                })
                .await?;
            if !rsvs.contains(&r.reservation_id) {
                rsvs.push(r.reservation_id);
            }
            Ok(Some(String::new()))
        }
        Step::Charge(r, x) | Step::Commit(r, x) if rsvs.is_empty() => {
            let _ = (r, x);
            Ok(None)
        }
        Step::Charge(r, x) => store
            .charge(&ChargeRequest {
                reservation_id: pick(r, rsvs),
                amount_micros: *x,
                attribution: None,
                idempotency_key: key,
            })
            .await
            .map(|r| Some(r.reservation_id)),
        Step::Commit(r, x) => store
            .commit(&CommitRequest {
                reservation_id: pick(r, rsvs),
                amount_micros: *x,
                idempotency_key: key,
            })
            .await
            .map(|r| Some(r.reservation_id)),
        Step::Release(r) if rsvs.is_empty() => {
            let _ = r;
            Ok(None)
        }
        Step::Release(r) => store
            .release(&ReleaseRequest {
                reservation_id: pick(r, rsvs),
                idempotency_key: key,
            })
            .await
            .map(|r| Some(r.reservation_id)),
        Step::Replay(_) => Ok(None),
    }
}

async fn check(steps: Vec<Step>) {
    let (_db, store) = common::store().await;
    let mk = |id: &str, kind: AccountKind, parent: &str, budget| CreateAccountRequest {
        account_id: id.into(),
        kind: kind as i32,
        parent_account_id: parent.into(),
        budget_micros: budget,
        idempotency_key: format!("create-{id}"),
        ..Default::default()
    };
    store
        .create_account(&mk("tenant", AccountKind::Tenant, "", 1_500))
        .await
        .unwrap();
    store
        .create_account(&mk("run-a", AccountKind::Run, "tenant", 1_000))
        .await
        .unwrap();
    store
        .create_account(&mk("run-b", AccountKind::Run, "", 1_000))
        .await
        .unwrap();
    let mut rsvs = Vec::new();
    // What each step posted against (Some when it succeeded and posted).
    let mut posted: Vec<Option<String>> = Vec::new();
    for i in 0..steps.len() {
        let before = snapshot(&store).await;
        let replay_of = match &steps[i] {
            Step::Replay(j) if *j < i && posted[*j].is_some() => Some(*j),
            _ => None,
        };
        let result = match replay_of {
            None => apply(&store, &steps, i, &mut rsvs, None).await,
            Some(j) => {
                // A replay must answer like the first call and change nothing.
                let fixed = posted[j].clone().filter(|s| !s.is_empty());
                let r = apply(&store, &steps, j, &mut rsvs, fixed).await;
                assert!(r.is_ok(), "replaying step {j} failed: {r:?}");
                assert_eq!(
                    snapshot(&store).await,
                    before,
                    "replaying step {j} posted again"
                );
                Ok(None)
            }
        };
        posted.push(result.as_ref().ok().cloned().flatten());
        match result {
            Ok(_) => {}
            Err(LedgerError::BudgetExceeded(_) | LedgerError::FailedPrecondition(_)) => {
                assert_eq!(snapshot(&store).await, before, "a refused call posted")
            }
            Err(e) => panic!("step {i} {:?}: {e}", steps[i]),
        }
        for a in snapshot(&store).await {
            assert_eq!(a.4, a.1 - a.2 - a.3, "{}: available", a.0);
            assert!(a.4 >= 0, "{}: available below zero", a.0);
        }
    }
    common::assert_books_balance(&store).await;
    // The tenant mirrors run-a.
    let s = snapshot(&store).await;
    let (run_a, tenant) = (&s[0], &s[2]);
    assert_eq!(
        (tenant.2, tenant.3),
        (run_a.2, run_a.3),
        "tenant mirrors its run"
    );
}

async fn snapshot(
    store: &forkyard_budget_ledger::LedgerStore,
) -> Vec<(String, i64, i64, i64, i64)> {
    let mut out = Vec::new();
    for id in ["run-a", "run-b", "tenant"] {
        let a = store.get_account(id).await.unwrap();
        out.push((
            id.to_owned(),
            a.budget_micros,
            a.reserved_micros,
            a.spent_micros,
            a.available_micros,
        ));
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn random_operation_sequences_keep_the_books(steps in proptest::collection::vec(step(), 1..40)) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(check(steps));
    }
}
