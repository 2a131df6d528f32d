//! Sweeps against a fake provisioner and a fake Temporal.

use forkyard_janitor::{
    GrpcSandboxes, JanitorError, JanitorService, Sandboxes, Sweeper, Workflows,
    classify::WorkflowState,
};
use forkyard_proto::{
    janitor::v1::{SweepReport, SweepRequest, janitor_client::JanitorClient},
    labels,
    sandbox::v1::{Sandbox, SnapshotInfo},
};
use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
};

#[derive(Default)]
struct FakeSandboxes {
    sandboxes: Vec<Sandbox>,
    fail_destroy: Vec<String>,
    destroyed: Mutex<Vec<(String, String)>>,
    snapshots: Vec<SnapshotInfo>,
    deleted_snapshots: Arc<Mutex<Vec<String>>>,
}

impl Sandboxes for FakeSandboxes {
    async fn list(&self) -> Result<Vec<Sandbox>, JanitorError> {
        Ok(self.sandboxes.clone())
    }

    async fn destroy(&self, sandbox_id: &str, reason: &str) -> Result<(), JanitorError> {
        if self.fail_destroy.iter().any(|s| s == sandbox_id) {
            return Err(JanitorError::Provisioner(tonic::Status::internal(
                "rm failed",
            )));
        }
        self.destroyed
            .lock()
            .unwrap()
            .push((sandbox_id.to_owned(), reason.to_owned()));
        Ok(())
    }

    async fn list_snapshots(&self) -> Result<Vec<SnapshotInfo>, JanitorError> {
        Ok(self.snapshots.clone())
    }

    async fn delete_snapshot(&self, snapshot_id: &str) -> Result<(), JanitorError> {
        self.deleted_snapshots
            .lock()
            .unwrap()
            .push(snapshot_id.to_owned());
        Ok(())
    }
}

/// Workflow id -> state; `None` means Temporal errors for it.
struct FakeWorkflows(HashMap<&'static str, Option<WorkflowState>>);

impl Workflows for FakeWorkflows {
    async fn state(&self, workflow_id: &str) -> Result<WorkflowState, JanitorError> {
        match self.0.get(workflow_id) {
            Some(Some(s)) => Ok(s.clone()),
            Some(None) => Err(JanitorError::Temporal("unavailable".into())),
            None => Ok(WorkflowState::NotFound),
        }
    }
}

use forkyard_common::clock::now_ms;

fn sandbox(id: &str, workflow: Option<&str>, age_secs: i64) -> Sandbox {
    let mut labels = HashMap::from([(labels::RUN_ID.to_owned(), "run-1".to_owned())]);
    if let Some(wf) = workflow {
        labels.insert(labels::WORKFLOW_ID.to_owned(), wf.to_owned());
    }
    Sandbox {
        id: id.into(),
        labels,
        created_unix_ms: now_ms() - age_secs * 1000,
        ..Default::default()
    }
}

fn fixture(fail_destroy: &[&str]) -> Sweeper<FakeSandboxes, FakeWorkflows> {
    let sandboxes = FakeSandboxes {
        sandboxes: vec![
            sandbox("sb-running", Some("wf-running"), 600),
            sandbox("sb-done", Some("wf-done"), 600),
            sandbox("sb-gone", Some("wf-gone"), 600),
            sandbox("sb-nolabel", None, 600),
            sandbox("sb-young", None, 5),
            sandbox("sb-unsure", Some("wf-temporal-down"), 600),
            sandbox("sb-terminated", Some("wf-terminated"), 600),
        ],
        fail_destroy: fail_destroy.iter().map(|s| (*s).to_owned()).collect(),
        ..Default::default()
    };
    let workflows = FakeWorkflows(HashMap::from([
        ("wf-running", Some(WorkflowState::Running)),
        ("wf-done", Some(WorkflowState::Closed("COMPLETED".into()))),
        (
            "wf-terminated",
            Some(WorkflowState::Closed("TERMINATED".into())),
        ),
        ("wf-temporal-down", None),
    ]));
    Sweeper::new(sandboxes, workflows)
}

fn summary(report: &SweepReport) -> Vec<(&str, &str, bool)> {
    let mut v: Vec<_> = report
        .actions
        .iter()
        .map(|a| (a.sandbox_id.as_str(), a.reason.as_str(), a.destroyed))
        .collect();
    v.sort();
    v
}

#[tokio::test]
async fn dry_run_reports_orphans_and_destroys_nothing() {
    let sweeper = fixture(&[]);
    let report = sweeper
        .sweep(&SweepRequest {
            max_age_secs: 0,
            heartbeat_grace_secs: 0,
            dry_run: true,
            min_age_secs: 60,
        })
        .await
        .unwrap();
    assert!(report.dry_run);
    assert_eq!(report.examined, 7);
    assert_eq!(
        summary(&report),
        [
            ("sb-done", "workflow closed: COMPLETED", false),
            ("sb-gone", "workflow not found", false),
            ("sb-nolabel", "no owner label", false),
            ("sb-terminated", "workflow closed: TERMINATED", false),
        ]
    );
    assert!(report.actions.iter().all(|a| a.error.is_empty()));
    let nolabel = report
        .actions
        .iter()
        .find(|a| a.sandbox_id == "sb-nolabel")
        .unwrap();
    assert_eq!(
        nolabel.labels.get(labels::RUN_ID).map(String::as_str),
        Some("run-1")
    );
}

#[tokio::test]
async fn sweep_destroys_orphans_only_and_records_failures() {
    let sweeper = Arc::new(fixture(&["sb-gone"]));
    let report = sweeper
        .sweep(&SweepRequest {
            max_age_secs: 0,
            heartbeat_grace_secs: 0,
            dry_run: false,
            min_age_secs: 60,
        })
        .await
        .unwrap();
    assert_eq!(
        summary(&report),
        [
            ("sb-done", "workflow closed: COMPLETED", true),
            ("sb-gone", "workflow not found", false),
            ("sb-nolabel", "no owner label", true),
            ("sb-terminated", "workflow closed: TERMINATED", true),
        ]
    );
    let gone = report
        .actions
        .iter()
        .find(|a| a.sandbox_id == "sb-gone")
        .unwrap();
    assert!(gone.error.contains("rm failed"), "{}", gone.error);
}

#[tokio::test]
async fn min_age_zero_considers_young_sandboxes() {
    let sweeper = fixture(&[]);
    let report = sweeper
        .sweep(&SweepRequest {
            max_age_secs: 0,
            heartbeat_grace_secs: 0,
            dry_run: true,
            min_age_secs: 0,
        })
        .await
        .unwrap();
    let ids: Vec<_> = summary(&report).into_iter().map(|(id, _, _)| id).collect();
    assert!(ids.contains(&"sb-young"), "{ids:?}");
    assert!(
        !ids.contains(&"sb-running") && !ids.contains(&"sb-unsure"),
        "{ids:?}"
    );
}

#[tokio::test]
async fn unreachable_provisioner_is_unavailable() {
    // A port nothing listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let sandboxes = GrpcSandboxes::connect_lazy(&format!("http://127.0.0.1:{port}")).unwrap();
    let sweeper = Arc::new(Sweeper::new(sandboxes, FakeWorkflows(HashMap::new())));

    let err = sweeper.sweep(&SweepRequest::default()).await.unwrap_err();
    assert!(
        matches!(err, JanitorError::ProvisionerUnavailable(_)),
        "{err:?}"
    );

    // And over the janitor's own gRPC API.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let routes = tonic::service::Routes::new(JanitorService::new(sweeper).into_server());
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(forkyard_common::server::serve(
        listener,
        routes,
        async move {
            let _ = stop_rx.await;
        },
    ));
    let mut client = JanitorClient::connect(format!("http://{addr}"))
        .await
        .unwrap();
    let status = client
        .sweep_now(SweepRequest {
            max_age_secs: 0,
            heartbeat_grace_secs: 0,
            dry_run: true,
            min_age_secs: 0,
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    let _ = stop_tx.send(());
    server.await.unwrap().unwrap();
}

#[test]
fn bad_provisioner_addr_is_refused() {
    assert!(matches!(
        GrpcSandboxes::connect_lazy("not a url"),
        Err(JanitorError::InvalidArgument {
            field: "provisioner_addr",
            ..
        })
    ));
}

#[test]
fn activity_uses_the_contract_name() {
    use forkyard_janitor::activities::JanitorActivities;
    assert_eq!(
        temporalio_common::ActivityDefinition::name(&JanitorActivities::sweep),
        "janitor.sweep"
    );
}

/// The run makes and checks a fork's sandbox before it starts the fork's workflow: in
/// that window the fork's workflow is unknown, and the running run keeps the sandbox.
#[tokio::test]
async fn a_sandbox_its_running_run_is_preparing_is_kept() {
    let mut preparing = sandbox("sb-preparing", Some("run-live/fork-1"), 600);
    preparing
        .labels
        .insert(labels::RUN_ID.to_owned(), "run-live".to_owned());
    let mut abandoned = sandbox("sb-abandoned", Some("run-over/fork-1"), 600);
    abandoned
        .labels
        .insert(labels::RUN_ID.to_owned(), "run-over".to_owned());
    let sweeper = Sweeper::new(
        FakeSandboxes {
            sandboxes: vec![preparing, abandoned],
            ..Default::default()
        },
        FakeWorkflows(HashMap::from([
            ("run-live", Some(WorkflowState::Running)),
            ("run-over", Some(WorkflowState::Closed("COMPLETED".into()))),
        ])),
    );
    let report = sweeper
        .sweep(&SweepRequest {
            dry_run: true,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(
        summary(&report),
        [("sb-abandoned", "workflow not found", false)]
    );
}

fn snapshot(id: &str, run: Option<&str>, age_secs: i64) -> SnapshotInfo {
    SnapshotInfo {
        id: id.into(),
        labels: run
            .map(|r| HashMap::from([(labels::RUN_ID.to_owned(), r.to_owned())]))
            .unwrap_or_default(),
        created_unix_ms: now_ms() - age_secs * 1000,
        ..Default::default()
    }
}

/// A fork tree's branch points left by runs that closed (their own removal failed) are
/// deleted; a running run's, a young one, one naming no run and one whose run Temporal
/// cannot be asked about are kept. A dry run only reports.
#[tokio::test]
async fn snapshots_of_runs_no_longer_running_are_deleted() {
    let sandboxes = FakeSandboxes {
        snapshots: vec![
            snapshot("snap-closed", Some("wf-done"), 600),
            snapshot("snap-gone", Some("wf-gone"), 600),
            snapshot("snap-running", Some("wf-running"), 600),
            snapshot("snap-young", Some("wf-done"), 5),
            snapshot("snap-nolabel", None, 600),
            snapshot("snap-unsure", Some("wf-temporal-down"), 600),
        ],
        ..Default::default()
    };
    let deleted = sandboxes.deleted_snapshots.clone();
    let workflows = FakeWorkflows(HashMap::from([
        ("wf-running", Some(WorkflowState::Running)),
        ("wf-done", Some(WorkflowState::Closed("COMPLETED".into()))),
        ("wf-temporal-down", None),
    ]));
    let sweeper = Sweeper::new(sandboxes, workflows);
    let req = |dry_run| SweepRequest {
        dry_run,
        min_age_secs: 60,
        ..Default::default()
    };
    let expected = |deleted| {
        vec![
            ("snap-closed", "run closed: COMPLETED", deleted),
            ("snap-gone", "run not found", deleted),
        ]
    };
    let dry = sweeper.sweep(&req(true)).await.unwrap();
    assert_eq!(summary(&dry), expected(false));
    assert!(dry.actions.iter().all(|a| a.kind == "snapshot"));
    assert!(deleted.lock().unwrap().is_empty());
    let report = sweeper.sweep(&req(false)).await.unwrap();
    assert_eq!(summary(&report), expected(true));
    let mut deleted = deleted.lock().unwrap().clone();
    deleted.sort();
    assert_eq!(deleted, ["snap-closed", "snap-gone"]);
}
