//! One sweep: list every sandbox, find its owner, destroy the orphans.

use crate::{
    classify::{self, Owner, Verdict, WorkflowState},
    error::JanitorError,
    sandboxes::{GrpcSandboxes, Sandboxes},
    workflows::Workflows,
};
use forkyard_proto::{
    janitor::v1::{SweepAction, SweepReport, SweepRequest},
    sandbox::v1::Sandbox,
};
use temporalio_client::Client;

/// Runs sweeps against a set of sandboxes and a source of workflow states, and (when
/// given the ledger) releases reservations their forks left behind.
pub struct Sweeper<S, W> {
    sandboxes: S,
    workflows: W,
    ledger: Option<crate::reservations::Ledger>,
    metrics: Option<crate::metrics::SweepMetrics>,
}

/// The sweeper the service runs: provisioner over gRPC, workflows from Temporal.
pub type LiveSweeper = Sweeper<GrpcSandboxes, Client>;

impl<S: Sandboxes, W: Workflows> Sweeper<S, W> {
    pub fn new(sandboxes: S, workflows: W) -> Self {
        Self {
            sandboxes,
            workflows,
            ledger: None,
            metrics: None,
        }
    }

    /// Count what sweeps do.
    pub fn with_metrics(mut self, metrics: crate::metrics::SweepMetrics) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// Also release stale reservations in this ledger.
    pub fn with_ledger(mut self, ledger: crate::reservations::Ledger) -> Self {
        self.ledger = Some(ledger);
        self
    }

    /// A fork sandbox whose workflow Temporal does not know: kept while its run is
    /// running (the run prepares a fork's sandbox before it starts the fork's workflow),
    /// an orphan otherwise. A run Temporal cannot be asked about keeps it too.
    async fn state_of_preparing_run(
        &self,
        labels: &std::collections::HashMap<String, String>,
        owner: &str,
    ) -> Owner {
        let Some(run) = classify::preparing_run(labels, owner) else {
            return Owner::Workflow(WorkflowState::NotFound);
        };
        match self.workflows.state(run).await {
            Ok(WorkflowState::Running | WorkflowState::Silent(_)) | Err(_) => {
                Owner::Workflow(WorkflowState::Running)
            }
            Ok(_) => Owner::Workflow(WorkflowState::NotFound),
        }
    }

    pub async fn sweep(&self, req: &SweepRequest) -> Result<SweepReport, JanitorError> {
        if let Some(m) = &self.metrics {
            m.sweep();
        }
        let sandboxes = self.sandboxes.list().await?;
        let now = now_ms();
        let mut report = SweepReport {
            dry_run: req.dry_run,
            ..Default::default()
        };
        for sb in sandboxes {
            report.examined += 1;
            if let Some(reason) = self.orphan_reason(&sb, req, now).await {
                report
                    .actions
                    .push(self.reap(&sb, reason, req.dry_run).await);
            }
        }
        crate::snapshots::sweep(&self.sandboxes, &self.workflows, req, now, &mut report).await;
        if let Some(ledger) = &self.ledger {
            // After the sandboxes: a stale reservation's fork never gets its money back
            // otherwise, but an unreachable ledger must not stop the sandbox sweep.
            self.release_stale(ledger, req.dry_run, &mut report).await;
        }
        Ok(report)
    }

    /// Why the sandbox is an orphan; `None` keeps it (too young, still owned, or its
    /// owner cannot be asked).
    async fn orphan_reason(&self, sb: &Sandbox, req: &SweepRequest, now: i64) -> Option<String> {
        if classify::too_young(sb.created_unix_ms, now, req.min_age_secs) {
            tracing::debug!(sandbox_id = %sb.id, "sandbox younger than min_age_secs, skipped");
            return None;
        }
        let verdict = if classify::too_old(sb.created_unix_ms, now, req.max_age_secs) {
            Verdict::Orphan(format!("older than max age ({} s)", req.max_age_secs))
        } else if sb.expires_unix_ms > 0 && sb.expires_unix_ms < now {
            // The provisioner reaps these itself; a sweep makes sure.
            Verdict::Orphan("provisioner TTL passed".into())
        } else {
            let owner = self.owner(sb).await?;
            let grace = match req.heartbeat_grace_secs {
                0 => classify::DEFAULT_HEARTBEAT_GRACE_SECS,
                g => g,
            };
            classify::classify(&owner, grace)
        };
        let Verdict::Orphan(reason) = verdict else {
            return None;
        };
        Some(reason)
    }

    /// Who owns the sandbox, by its labels; `None` when Temporal cannot tell.
    async fn owner(&self, sb: &Sandbox) -> Option<Owner> {
        let Some(wf) = classify::owner_workflow_id(&sb.labels) else {
            return Some(Owner::NoLabel);
        };
        match self.workflows.state(wf).await {
            Ok(WorkflowState::NotFound) => Some(self.state_of_preparing_run(&sb.labels, wf).await),
            Ok(state) => Some(Owner::Workflow(state)),
            Err(e) => {
                // Cannot tell whether its workflow runs: never touch it.
                tracing::warn!(sandbox_id = %sb.id, workflow_id = wf, error = %e, "cannot check owner, sandbox kept");
                None
            }
        }
    }

    /// Destroy an orphan (only report it on a dry run).
    async fn reap(&self, sb: &Sandbox, reason: String, dry_run: bool) -> SweepAction {
        let mut action = SweepAction {
            sandbox_id: sb.id.clone(),
            reason: reason.clone(),
            destroyed: false,
            error: String::new(),
            labels: sb.labels.clone(),
            kind: String::new(),
        };
        if dry_run {
            tracing::info!(sandbox_id = %sb.id, %reason, "orphan (dry run, kept)");
            return action;
        }
        match self
            .sandboxes
            .destroy(&sb.id, &format!("orphan: {reason}"))
            .await
        {
            Ok(()) => {
                tracing::info!(sandbox_id = %sb.id, %reason, "orphan destroyed");
                action.destroyed = true;
                if let Some(m) = &self.metrics {
                    m.reaped(&reason);
                }
            }
            Err(e) => {
                tracing::warn!(sandbox_id = %sb.id, %reason, error = %e, "orphan destroy failed");
                action.error = e.to_string();
            }
        }
        action
    }

    /// Release the reservations forks left behind, into the report.
    async fn release_stale(
        &self,
        ledger: &crate::reservations::Ledger,
        dry_run: bool,
        report: &mut SweepReport,
    ) {
        match ledger.sweep(&self.workflows, dry_run).await {
            Ok(actions) => {
                if let Some(m) = &self.metrics {
                    for a in actions.iter().filter(|a| a.released) {
                        m.released(&a.reason);
                    }
                }
                report.reservations = actions;
            }
            Err(e) => {
                tracing::warn!(error = %e, "stale reservations not swept");
                report.reservations_error = e.to_string();
            }
        }
    }
}

use forkyard_common::clock::now_ms;
