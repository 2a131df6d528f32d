//! A finish attempt retried after the gateway running it died: the forks the first
//! attempt finished (its last heartbeat's details, which the activity reads as
//! `activities::finish::earlier` and hands to `finish_after`) come back as that attempt left them, without
//! asking a provisioner or the ledger again (their sandboxes are destroyed by then);
//! the others are finished afresh. Peers here are unreachable addresses, so any fork
//! finished again shows their errors.

use forkyard_gateway::{
    activities::{
        finish::{Finish, FinishProgress, Finished},
        host::WaveLocal,
        ledger::LedgerLocal,
        sandboxes::SandboxLocal,
    },
    lifecycle::{AtOwner, item::FinishItem},
};
use forkyard_proto::{budget::v1::Reservation, sandbox::v1::CollectPatchResponse};

const NOWHERE: &str = "http://127.0.0.1:9";

fn item(fork: u32) -> FinishItem {
    FinishItem {
        run_id: "run-r".into(),
        fork,
        sandbox: AtOwner {
            endpoint: NOWHERE.into(),
            sandbox_id: format!("sbx-{fork}"),
            reason: "fork finished".into(),
        },
        collect_patch: true,
        succeeds_with_patch: true,
        reservation_id: format!("res-{fork}"),
        cost_micros: 10,
        sandbox_charged_micros: 0,
        commit_key: format!("run-r/fork-{fork}/a1/commit"),
        release_key: format!("run-r/fork-{fork}/a1/release"),
        sandbox_lost: false,
        snapshot: false,
    }
}

#[tokio::test]
async fn a_retried_finish_returns_what_the_first_attempt_finished_and_finishes_the_rest() {
    let wave = WaveLocal::new(
        &LedgerLocal::new(NOWHERE).unwrap(),
        &SandboxLocal::new(NOWHERE).unwrap(),
    );
    let first = Finished {
        patch: Some(CollectPatchResponse {
            patch: "+fork 1\n".into(),
            ..Default::default()
        }),
        committed: true,
        reservation: Some(Reservation {
            reservation_id: "res-1".into(),
            committed_micros: 10,
            ..Default::default()
        }),
        amount_micros: 10,
        ..Default::default()
    };
    let heartbeat = FinishProgress {
        done: [(0, first.clone())].into(),
    };
    let out = wave
        .finish_after(
            heartbeat,
            Finish {
                forks: vec![item(1), item(2)],
                patch_max_bytes: 16 * 1024,
            },
        )
        .await;
    assert_eq!(out.forks.len(), 2);
    let again = &out.forks[0];
    assert_eq!(
        again.patch.as_ref().map(|p| p.patch.as_str()),
        Some("+fork 1\n")
    );
    assert!(
        again.patch_error.is_empty()
            && again.settle_error.is_empty()
            && again.destroy_error.is_empty(),
        "fork 1 was finished again: {again:?}"
    );
    assert_eq!(
        again.reservation.as_ref().map(|r| r.committed_micros),
        Some(10)
    );
    // Fork 2 had not finished: it is done now (against peers that are not there).
    let rest = &out.forks[1];
    assert!(
        rest.patch.is_none() && !rest.patch_error.is_empty(),
        "{rest:?}"
    );
}
