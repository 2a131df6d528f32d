//! The janitor end to end: orphans seeded three ways — the whole mesh killed with
//! `kill -9` mid-run and Temporal's state lost, a sandbox made outside any workflow, a run
//! terminated through Temporal — are all destroyed by one sweep, their
//! reservations released, while a run that is still going keeps every sandbox.

use forkyard_proto::{
    budget::v1::{
        ListReservationsRequest, ReservationState, budget_ledger_client::BudgetLedgerClient,
    },
    janitor::v1::{SweepReport, SweepRequest, janitor_client::JanitorClient},
    labels,
    sandbox::v1::{
        CreateSandboxRequest, ListSandboxesRequest, Sandbox,
        sandbox_provisioner_client::SandboxProvisionerClient,
    },
};
use forkyard_tests::{
    Mesh,
    mesh::SERVICES,
    repo,
    support::{Gateway, is_closed, launch, wait_until},
};
use std::{collections::HashMap, path::Path, time::Duration};
use tonic::transport::Channel;

type Janitor = JanitorClient<Channel>;

async fn sandboxes_of(mesh: &Mesh, run_id: Option<&str>) -> Vec<Sandbox> {
    let mut prov =
        SandboxProvisionerClient::new(mesh.channel("sandbox-provisioner").await.unwrap());
    let label_selector = run_id
        .map(|r| HashMap::from([(labels::RUN_ID.to_owned(), r.to_owned())]))
        .unwrap_or_default();
    prov.list_sandboxes(ListSandboxesRequest { label_selector })
        .await
        .unwrap()
        .into_inner()
        .sandboxes
}

async fn held(mesh: &Mesh) -> Vec<String> {
    let mut ledger = BudgetLedgerClient::new(mesh.channel("budget-ledger").await.unwrap());
    let req = ListReservationsRequest {
        account_id: String::new(),
        state: ReservationState::Held as i32,
    };
    ledger
        .list_reservations(req)
        .await
        .unwrap()
        .into_inner()
        .reservations
        .into_iter()
        .map(|r| r.holder)
        .collect()
}

async fn wait_agents(mesh: &Mesh, run_id: &str, n: usize) {
    for _ in 0..300 {
        let s = sandboxes_of(mesh, Some(run_id)).await;
        if s.iter().filter(|s| s.running_execs > 0).count() == n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{n} agents of {run_id} never ran");
}

/// A run in flight when everything dies (`kill -9`) and Temporal's state is lost: its id,
/// once the restarted provisioner has found its two sandboxes again.
async fn lose_a_run_in_a_disaster(mesh: &mut Mesh, gw: &mut Gateway, src: &Path) -> String {
    let lost = gw
        .launch_run(launch(src, 2, 2, "sleep 300"))
        .await
        .unwrap()
        .into_inner()
        .run_id;
    wait_agents(mesh, &lost, 2).await;
    for s in SERVICES {
        mesh.kill9(s);
    }
    mesh.kill9("temporal");
    mesh.start_temporal("temporal-after-disaster.db").unwrap();
    for s in SERVICES {
        mesh.start_service(s).unwrap();
    }
    for s in SERVICES {
        mesh.wait_serving(s, Duration::from_secs(90)).await.unwrap();
    }
    lost
}

/// A sandbox made outside any workflow.
async fn stray_sandbox(mesh: &Mesh, src: &Path) -> String {
    let mut prov =
        SandboxProvisionerClient::new(mesh.channel("sandbox-provisioner").await.unwrap());
    prov.create_sandbox(CreateSandboxRequest {
        repo: src.to_string_lossy().into_owned(),
        branch: "stray".into(),
        ..Default::default()
    })
    .await
    .unwrap()
    .into_inner()
    .id
}

/// A run terminated through Temporal (its forks' cleanup never runs), and a healthy run
/// that must be left alone: (victim, live).
async fn terminate_one_of_two_runs(mesh: &Mesh, gw: &mut Gateway, src: &Path) -> (String, String) {
    let victim = gw
        .launch_run(launch(src, 1, 1, "sleep 300"))
        .await
        .unwrap()
        .into_inner()
        .run_id;
    let live = gw
        .launch_run(launch(src, 2, 2, "sleep 300"))
        .await
        .unwrap()
        .into_inner()
        .run_id;
    wait_agents(mesh, &victim, 1).await;
    wait_agents(mesh, &live, 2).await;
    let out = std::process::Command::new(forkyard_tests::mesh::temporal_cli())
        .args([
            "workflow",
            "terminate",
            "--address",
            &mesh.temporal_address(),
            "--reason",
            "test",
        ])
        .args(["-w", &victim])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    wait_until(gw, &victim, Duration::from_secs(60), is_closed).await;
    (victim, live)
}

/// A dry run reports the four orphans and changes nothing.
async fn assert_a_dry_run_changes_nothing(mesh: &Mesh, janitor: &mut Janitor) {
    let dry = janitor
        .sweep_now(SweepRequest {
            dry_run: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(dry.actions.len(), 4, "{dry:#?}");
    assert!(dry.actions.iter().all(|a| !a.destroyed));
    assert_eq!(
        sandboxes_of(mesh, None).await.len(),
        6,
        "a dry run changes nothing"
    );
}

/// Each orphan destroyed, for its own reason.
fn assert_reaped_for_their_reasons(report: &SweepReport, stray: &str, victim: &str, lost: &str) {
    let reason_of = |id: &str| {
        report
            .actions
            .iter()
            .find(|a| a.sandbox_id == id)
            .map(|a| a.reason.clone())
    };
    assert_eq!(
        reason_of(stray).as_deref(),
        Some("no owner label"),
        "{report:#?}"
    );
    let victim_reason = report
        .actions
        .iter()
        .find(|a| a.labels.get(labels::RUN_ID).map(String::as_str) == Some(victim))
        .map(|a| a.reason.clone());
    assert_eq!(
        victim_reason.as_deref(),
        Some("workflow closed: TERMINATED"),
        "{report:#?}"
    );
    let lost_reasons: Vec<&str> = report
        .actions
        .iter()
        .filter(|a| a.labels.get(labels::RUN_ID).map(String::as_str) == Some(lost))
        .map(|a| a.reason.as_str())
        .collect();
    assert_eq!(lost_reasons, vec!["workflow not found"; 2], "{report:#?}");
    assert!(
        report
            .actions
            .iter()
            .all(|a| a.destroyed && a.error.is_empty()),
        "{report:#?}"
    );
}

async fn assert_only_these_remain(mesh: &Mesh, live_sandboxes: &[String]) {
    let remaining: Vec<String> = sandboxes_of(mesh, None)
        .await
        .into_iter()
        .map(|s| s.id)
        .collect();
    let mut expected = live_sandboxes.to_vec();
    expected.sort();
    let mut remaining_sorted = remaining.clone();
    remaining_sorted.sort();
    assert_eq!(
        remaining_sorted, expected,
        "only the live run's sandboxes remain"
    );
}

/// Their reservations went back to their runs; the live run's stay held.
async fn assert_reservations_released(
    mesh: &Mesh,
    report: &SweepReport,
    victim: &str,
    lost: &str,
    live: &str,
) {
    let released: Vec<&str> = report
        .reservations
        .iter()
        .filter(|r| r.released)
        .map(|r| r.holder.as_str())
        .collect();
    assert_eq!(
        released.iter().filter(|h| **h == victim).count(),
        1,
        "{report:#?}"
    );
    assert_eq!(
        released.iter().filter(|h| **h == lost).count(),
        2,
        "{report:#?}"
    );
    let still_held = held(mesh).await;
    let mut want = vec![live.to_owned(), live.to_owned()];
    want.sort();
    let mut got = still_held.clone();
    got.sort();
    assert_eq!(got, want);
}

/// The janitor's metrics count what happened, by reason.
fn assert_reaped_counted(mesh: &Mesh) {
    let metrics = mesh.scrape("janitor").unwrap();
    for line in [
        r#"janitor_sandboxes_reaped_total{reason="workflow_not_found"} 2"#,
        r#"janitor_sandboxes_reaped_total{reason="no_owner"} 1"#,
        r#"janitor_sandboxes_reaped_total{reason="workflow_closed"} 1"#,
        r#"janitor_reservations_released_total{reason="workflow_not_found"} 2"#,
        r#"janitor_reservations_released_total{reason="workflow_closed"} 1"#,
        "janitor_sweeps_total 3",
    ] {
        assert!(
            metrics.lines().any(|l| l == line),
            "no {line:?} in\n{metrics}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_sweep_reaps_every_kind_of_orphan_and_spares_live_runs() {
    let mut mesh = Mesh::start().await.expect("mesh starts");
    let src = tempfile::tempdir().unwrap();
    repo::create(src.path()).unwrap();
    let mut gw = Gateway::new(mesh.channel("gateway").await.unwrap());

    let lost = lose_a_run_in_a_disaster(&mut mesh, &mut gw, src.path()).await;
    let mut gw = Gateway::new(mesh.channel("gateway").await.unwrap());
    assert_eq!(
        sandboxes_of(&mesh, Some(&lost)).await.len(),
        2,
        "the provisioner found its sandboxes again"
    );
    let stray = stray_sandbox(&mesh, src.path()).await;
    let (victim, live) = terminate_one_of_two_runs(&mesh, &mut gw, src.path()).await;
    let live_sandboxes: Vec<String> = sandboxes_of(&mesh, Some(&live))
        .await
        .into_iter()
        .map(|s| s.id)
        .collect();
    assert_eq!(live_sandboxes.len(), 2);
    // An inline fork's reservation is held by its run.
    let stale_holders = held(&mesh).await;
    assert!(stale_holders.contains(&victim), "{stale_holders:?}");
    assert!(stale_holders.contains(&lost), "{stale_holders:?}");

    // One sweep.
    let mut janitor = Janitor::new(mesh.channel("janitor").await.unwrap());
    assert_a_dry_run_changes_nothing(&mesh, &mut janitor).await;
    let report = janitor
        .sweep_now(SweepRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_reaped_for_their_reasons(&report, &stray, &victim, &lost);
    assert_only_these_remain(&mesh, &live_sandboxes).await;
    assert_reservations_released(&mesh, &report, &victim, &lost, &live).await;
    // A second sweep finds nothing more.
    let again = janitor
        .sweep_now(SweepRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert!(
        again.actions.is_empty() && again.reservations.is_empty(),
        "{again:#?}"
    );
    assert_reaped_counted(&mesh);
}

/// StartCleanup's schedule really sweeps: a tick (triggered now rather than waiting for the
/// interval) runs ScheduledCleanupWorkflow, whose janitor.sweep destroys a stray sandbox.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cleanup_schedule_tick_sweeps_through_the_janitor_queue() {
    use forkyard_proto::gateway::v1::{StartCleanupRequest, StopCleanupRequest};
    let mesh = Mesh::start().await.expect("mesh starts");
    let src = tempfile::tempdir().unwrap();
    repo::create(src.path()).unwrap();
    let mut gw = Gateway::new(mesh.channel("gateway").await.unwrap());
    let mut prov =
        SandboxProvisionerClient::new(mesh.channel("sandbox-provisioner").await.unwrap());
    let stray = prov
        .create_sandbox(CreateSandboxRequest {
            repo: src.path().to_string_lossy().into_owned(),
            branch: "stray".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .id;
    let started = gw
        .start_cleanup(StartCleanupRequest {
            interval_minutes: 60,
            max_age_minutes: 180,
        })
        .await
        .unwrap();
    let schedule_id = started.into_inner().schedule_id;
    // Schedule ticks skip sandboxes younger than a minute (creation may be in flight).
    tokio::time::sleep(Duration::from_secs(61)).await;
    let out = std::process::Command::new(forkyard_tests::mesh::temporal_cli())
        .args([
            "schedule",
            "trigger",
            "--address",
            &mesh.temporal_address(),
            "--schedule-id",
            &schedule_id,
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut gone = false;
    for _ in 0..150 {
        if !sandboxes_of(&mesh, None)
            .await
            .iter()
            .any(|s| s.id == stray)
        {
            gone = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(gone, "the scheduled sweep did not destroy {stray}");
    let metrics = mesh.scrape("janitor").unwrap();
    assert!(
        metrics
            .lines()
            .any(|l| l == r#"janitor_sandboxes_reaped_total{reason="no_owner"} 1"#),
        "{metrics}"
    );
    gw.stop_cleanup(StopCleanupRequest {}).await.unwrap();
}
