//! Snapshots a run left: a fork tree's branch points are removed by their run when it
//! closes; one whose removal failed (a provisioner down then, a run terminated) would
//! keep its disk for ever. A sweep deletes every snapshot whose run is no longer running.

use crate::{
    classify::{self, WorkflowState},
    sandboxes::Sandboxes,
    workflows::Workflows,
};
use forkyard_proto::{
    janitor::v1::{SweepAction, SweepReport, SweepRequest},
    labels,
    sandbox::v1::SnapshotInfo,
};

/// Why `snap` is left over, given its run's state; `None` keeps it: its run runs (or
/// cannot be asked), it names no run (not a run's: never touched), or it is too young.
pub(crate) async fn orphan_reason<W: Workflows>(
    workflows: &W,
    snap: &SnapshotInfo,
    req: &SweepRequest,
    now: i64,
) -> Option<String> {
    let run = snap.labels.get(labels::RUN_ID).map(|r| r.trim())?;
    if run.is_empty() || classify::too_young(snap.created_unix_ms, now, req.min_age_secs) {
        return None;
    }
    match workflows.state(run).await {
        Ok(WorkflowState::Closed(status)) => Some(format!("run closed: {status}")),
        Ok(WorkflowState::NotFound) => Some("run not found".into()),
        Ok(_) => None,
        Err(e) => {
            tracing::warn!(snapshot_id = %snap.id, run_id = run, error = %e, "cannot check the snapshot's run, kept");
            None
        }
    }
}

/// Delete the snapshots of runs that are no longer running (report them only on a dry
/// run), into `report`.
pub(crate) async fn sweep<S: Sandboxes, W: Workflows>(
    sandboxes: &S,
    workflows: &W,
    req: &SweepRequest,
    now: i64,
    report: &mut SweepReport,
) {
    let snapshots = match sandboxes.list_snapshots().await {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %e, "snapshots not swept");
            return;
        }
    };
    for snap in snapshots {
        let Some(reason) = orphan_reason(workflows, &snap, req, now).await else {
            continue;
        };
        let mut action = SweepAction {
            sandbox_id: snap.id.clone(),
            reason: reason.clone(),
            labels: snap.labels.clone(),
            kind: "snapshot".into(),
            ..Default::default()
        };
        if !req.dry_run {
            match sandboxes.delete_snapshot(&snap.id).await {
                Ok(()) => {
                    tracing::info!(snapshot_id = %snap.id, %reason, "left-over snapshot deleted");
                    action.destroyed = true;
                }
                Err(e) => action.error = e.to_string(),
            }
        }
        report.actions.push(action);
    }
}
