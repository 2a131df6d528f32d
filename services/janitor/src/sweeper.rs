//! One sweep: list every sandbox, find its owner, destroy the orphans.

use crate::{
    classify::{self, Owner, Verdict, WorkflowState},
    error::JanitorError,
};
use forkyard_common::{
    discovery,
    grpc_telemetry::{TracedChannel, traced_channel},
};
use forkyard_proto::{
    janitor::v1::{SweepAction, SweepReport, SweepRequest},
    sandbox::v1::{
        DestroySandboxRequest, ListSandboxesRequest, Sandbox,
        sandbox_provisioner_client::SandboxProvisionerClient,
    },
};
use std::{
    collections::HashMap,
    future::Future,
    sync::{Arc, Mutex, PoisonError},
};
use temporalio_client::{
    Client, UntypedWorkflow, WorkflowDescribeOptions, WorkflowExecutionStatus,
    errors::WorkflowInteractionError,
};

/// Where the sandboxes are: the provisioner's gRPC API, or a fake in tests.
pub trait Sandboxes: Send + Sync + 'static {
    fn list(&self) -> impl Future<Output = Result<Vec<Sandbox>, JanitorError>> + Send;
    fn destroy(
        &self,
        sandbox_id: &str,
        reason: &str,
    ) -> impl Future<Output = Result<(), JanitorError>> + Send;
}

/// Who answers "is this workflow still running": Temporal, or a fake in tests.
pub trait Workflows: Send + Sync + 'static {
    fn state(
        &self,
        workflow_id: &str,
    ) -> impl Future<Output = Result<WorkflowState, JanitorError>> + Send;
}

type ProvisionerClient = SandboxProvisionerClient<TracedChannel>;

/// Every provisioner replica through its gRPC API: each sweep looks the configured
/// names up again and lists every replica they resolve to (a headless Service or a
/// Compose service name resolves to all of them); a sandbox is destroyed at the
/// replica that listed it.
#[derive(Clone)]
pub struct GrpcSandboxes {
    targets: Vec<discovery::Target>,
    state: Arc<Mutex<ReplicaState>>,
}

#[derive(Default)]
struct ReplicaState {
    /// One lazily connected client per replica URL seen.
    clients: HashMap<String, ProvisionerClient>,
    /// Sandbox id → the replica URL that listed it last.
    owners: HashMap<String, String>,
}

impl GrpcSandboxes {
    /// Clients for the replicas of `addrs` (e.g. `http://sandbox-provisioner:50052`),
    /// connected on first use, so the janitor starts while the provisioner is down.
    pub fn connect_lazy(addrs: &str) -> Result<Self, JanitorError> {
        let targets = discovery::parse("provisioner_addr", addrs).map_err(|reason| {
            JanitorError::InvalidArgument {
                field: "provisioner_addr",
                reason,
            }
        })?;
        Ok(Self {
            targets,
            state: Arc::default(),
        })
    }

    fn client(&self, replica: &discovery::Replica) -> Result<ProvisionerClient, JanitorError> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(c) = state.clients.get(&replica.url) {
            return Ok(c.clone());
        }
        let ep = discovery::endpoint(replica).map_err(|reason| JanitorError::InvalidArgument {
            field: "provisioner_addr",
            reason,
        })?;
        let client = SandboxProvisionerClient::new(traced_channel(
            ep.timeout(forkyard_common::tls::SHORT_CALL_DEADLINE)
                .connect_lazy(),
        ));
        state.clients.insert(replica.url.clone(), client.clone());
        Ok(client)
    }
}

impl Sandboxes for GrpcSandboxes {
    /// Every reachable replica's sandboxes; an error only when none answered (a replica
    /// that cannot be asked now is swept next time, and logged).
    async fn list(&self) -> Result<Vec<Sandbox>, JanitorError> {
        let (replicas, lookup_errors) = discovery::replicas(&self.targets).await;
        for e in &lookup_errors {
            tracing::warn!(setting = "FORKYARD_PROVISIONER_ADDR", error = %e, "provisioner lookup failed");
        }
        let mut all = Vec::new();
        let mut owners = HashMap::new();
        let mut last_error = lookup_errors
            .into_iter()
            .next()
            .map(JanitorError::ProvisionerUnavailable);
        let mut answered = 0;
        for replica in &replicas {
            let listed = self
                .client(replica)?
                .list_sandboxes(ListSandboxesRequest::default())
                .await;
            match listed {
                Ok(resp) => {
                    answered += 1;
                    for s in resp.into_inner().sandboxes {
                        owners.insert(s.id.clone(), replica.url.clone());
                        all.push(s);
                    }
                }
                Err(status) => {
                    tracing::warn!(replica = %replica.url, error = %status.message(), "provisioner replica did not list its sandboxes");
                    last_error = Some(JanitorError::from_provisioner(status));
                }
            }
        }
        if answered == 0 {
            return Err(last_error.unwrap_or_else(|| {
                JanitorError::ProvisionerUnavailable("no provisioner replica resolved".into())
            }));
        }
        self.state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .owners = owners;
        Ok(all)
    }

    async fn destroy(&self, sandbox_id: &str, reason: &str) -> Result<(), JanitorError> {
        let client = {
            let state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
            state
                .owners
                .get(sandbox_id)
                .and_then(|url| state.clients.get(url))
                .cloned()
        };
        let Some(mut client) = client else {
            return Err(JanitorError::Provisioner(tonic::Status::not_found(
                format!("sandbox {sandbox_id} was not listed by any provisioner replica"),
            )));
        };
        let req = DestroySandboxRequest {
            sandbox_id: sandbox_id.to_owned(),
            reason: reason.to_owned(),
        };
        client
            .destroy_sandbox(req)
            .await
            .map_err(JanitorError::from_provisioner)?;
        Ok(())
    }
}

impl Workflows for Client {
    async fn state(&self, workflow_id: &str) -> Result<WorkflowState, JanitorError> {
        let handle = self.get_workflow_handle::<UntypedWorkflow>(workflow_id);
        match handle.describe(WorkflowDescribeOptions::default()).await {
            Ok(desc) => {
                let state = workflow_state(desc.status());
                if state != WorkflowState::Running {
                    return Ok(state);
                }
                Ok(agent_silence_secs(&desc.raw_description).map_or(state, WorkflowState::Silent))
            }
            Err(WorkflowInteractionError::NotFound(_)) => Ok(WorkflowState::NotFound),
            Err(e) => Err(JanitorError::Temporal(format!(
                "describe workflow {workflow_id:?}: {e}"
            ))),
        }
    }
}

/// How long the workflow's started agent activity has gone without a heartbeat (since
/// its last heartbeat, or its start if none), if one is running.
fn agent_silence_secs(
    desc: &temporalio_common::protos::temporal::api::workflowservice::v1::DescribeWorkflowExecutionResponse,
) -> Option<u64> {
    use temporalio_common::protos::temporal::api::enums::v1::PendingActivityState;
    let now = std::time::SystemTime::now();
    desc.pending_activities
        .iter()
        .filter(|a| {
            a.activity_type
                .as_ref()
                .is_some_and(|t| t.name == "agent.run")
        })
        .filter(|a| a.state == PendingActivityState::Started as i32)
        .filter_map(|a| {
            let last = a.last_heartbeat_time.or(a.last_started_time)?;
            let last = std::time::UNIX_EPOCH
                + std::time::Duration::new(
                    u64::try_from(last.seconds).ok()?,
                    u32::try_from(last.nanos).ok()?,
                );
            now.duration_since(last).ok().map(|d| d.as_secs())
        })
        .max()
}

/// Temporal's status as the janitor sees it; names as in Temporal's API.
pub fn workflow_state(status: WorkflowExecutionStatus) -> WorkflowState {
    use WorkflowExecutionStatus as S;
    let closed = |name: &str| WorkflowState::Closed(name.to_owned());
    match status {
        S::Running | S::Paused => WorkflowState::Running,
        S::Completed => closed("COMPLETED"),
        S::Failed => closed("FAILED"),
        S::Canceled => closed("CANCELED"),
        S::Terminated => closed("TERMINATED"),
        S::ContinuedAsNew => closed("CONTINUED_AS_NEW"),
        S::TimedOut => closed("TIMED_OUT"),
        // Unspecified, Unknown and statuses newer than this code: never destroy.
        _ => WorkflowState::Unknown,
    }
}

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
            if classify::too_young(sb.created_unix_ms, now, req.min_age_secs) {
                tracing::debug!(sandbox_id = %sb.id, "sandbox younger than min_age_secs, skipped");
                continue;
            }
            let verdict = if classify::too_old(sb.created_unix_ms, now, req.max_age_secs) {
                Verdict::Orphan(format!("older than max age ({} s)", req.max_age_secs))
            } else if sb.expires_unix_ms > 0 && sb.expires_unix_ms < now {
                // The provisioner reaps these itself; a sweep makes sure.
                Verdict::Orphan("provisioner TTL passed".into())
            } else {
                let owner = match classify::owner_workflow_id(&sb.labels) {
                    None => Owner::NoLabel,
                    Some(wf) => match self.workflows.state(wf).await {
                        Ok(WorkflowState::NotFound) => {
                            self.state_of_preparing_run(&sb.labels, wf).await
                        }
                        Ok(state) => Owner::Workflow(state),
                        Err(e) => {
                            // Cannot tell whether its workflow runs: never touch it.
                            tracing::warn!(sandbox_id = %sb.id, workflow_id = wf, error = %e, "cannot check owner, sandbox kept");
                            continue;
                        }
                    },
                };
                let grace = match req.heartbeat_grace_secs {
                    0 => classify::DEFAULT_HEARTBEAT_GRACE_SECS,
                    g => g,
                };
                classify::classify(&owner, grace)
            };
            let Verdict::Orphan(reason) = verdict else {
                continue;
            };
            let mut action = SweepAction {
                sandbox_id: sb.id.clone(),
                reason: reason.clone(),
                destroyed: false,
                error: String::new(),
                labels: sb.labels.clone(),
            };
            if req.dry_run {
                tracing::info!(sandbox_id = %sb.id, %reason, "orphan (dry run, kept)");
            } else {
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
            }
            report.actions.push(action);
        }
        if let Some(ledger) = &self.ledger {
            // After the sandboxes: a stale reservation's fork never gets its money back
            // otherwise, but an unreachable ledger must not stop the sandbox sweep.
            match ledger.sweep(&self.workflows, req.dry_run).await {
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
        Ok(report)
    }
}

use forkyard_common::clock::now_ms;

#[cfg(test)]
mod tests {
    use super::*;
    use WorkflowExecutionStatus as S;

    #[test]
    fn temporal_status_table() {
        let closed = |s: &str| WorkflowState::Closed(s.to_owned());
        let cases = [
            (S::Running, WorkflowState::Running),
            (S::Paused, WorkflowState::Running),
            (S::Completed, closed("COMPLETED")),
            (S::Failed, closed("FAILED")),
            (S::Canceled, closed("CANCELED")),
            (S::Terminated, closed("TERMINATED")),
            (S::ContinuedAsNew, closed("CONTINUED_AS_NEW")),
            (S::TimedOut, closed("TIMED_OUT")),
            (S::Unspecified, WorkflowState::Unknown),
            (S::Unknown, WorkflowState::Unknown),
        ];
        for (status, want) in cases {
            assert_eq!(workflow_state(status), want, "{status:?}");
        }
    }
}
