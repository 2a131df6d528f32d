//! LaunchRun: a checked request started as a run workflow, once per request id.

use super::GatewayService;
use crate::{
    auth::Tenant, error::GatewayError, search, validate, workflows::SandboxOrchestrationWorkflow,
};
use forkyard_common::repo_location::{self, RepoLocation};
use forkyard_proto::{
    gateway::v1::{Delivery, LaunchRunRequest, LaunchRunResponse, RunSpec, delivery::PullRequests},
    queues,
};
use temporalio_client::{WorkflowIdReusePolicy, WorkflowStartOptions, errors::WorkflowStartError};
use temporalio_common::search_attributes::SearchAttributes;

impl GatewayService {
    pub(super) async fn launch(
        &self,
        tenant: &Tenant,
        req: LaunchRunRequest,
    ) -> Result<LaunchRunResponse, GatewayError> {
        let mut spec = validate::launch_spec(&req, &self.limits)?;
        self.check_agent(&spec).await?;
        let run_id = launch_run_id(tenant, &req.request_id)?;
        self.admit(tenant, &req.egress, &mut spec).await?;
        let forks = spec.forks;
        match self
            .client
            .start_workflow(
                SandboxOrchestrationWorkflow::run,
                spec.clone(),
                start_options(tenant, &run_id, &spec),
            )
            .await
        {
            Ok(_) => {
                tracing::info!(run_id, forks, "run launched");
                Ok(LaunchRunResponse {
                    run_id,
                    created: true,
                })
            }
            Err(WorkflowStartError::AlreadyStarted { .. }) => {
                self.launched_before(run_id, &spec, &req.request_id).await
            }
            Err(e) => Err(GatewayError::from_start(e)),
        }
    }

    /// Refuse a launch whose agent spec the runner cannot run (see `AgentRunnerLink::check`).
    async fn check_agent(&self, spec: &RunSpec) -> Result<(), GatewayError> {
        match (&self.agent_runner, &spec.agent) {
            (Some(link), Some(agent)) => link.check(agent).await,
            _ => Ok(()),
        }
    }

    /// What the tenant's policies make of the spec: its repository allowed (and
    /// answering, with its base ref), its egress allowed, a slot for its forks and an
    /// account for its spending.
    async fn admit(
        &self,
        tenant: &Tenant,
        egress: &[String],
        spec: &mut RunSpec,
    ) -> Result<(), GatewayError> {
        spec.repo = self.tenancy.repos.check(&spec.repo)?;
        spec.egress = self.tenancy.egress.check(&tenant.name, egress)?;
        self.admit_backends(tenant, spec).await?;
        let reader = crate::repo_check::Reader {
            tenant: &tenant.name,
            credentials: &self.tenancy.repos.credentials,
        };
        let repos = &self.tenancy.repos;
        validate::check_repo(&spec.repo, &spec.base_ref, &repos.git_hosts, reader).await?;
        if let Some(d) = &spec.delivery {
            check_delivery_access(repos, &tenant.name, &spec.repo, d).await?;
        }
        spec.tenant.clone_from(&tenant.name);
        self.check_fork_slots(tenant, fork_slots(spec)).await?;
        spec.tenant_account_id = self.tenant_account(tenant).await?.unwrap_or_default();
        Ok(())
    }

    /// Same request id: the same run, as long as it is the same request.
    async fn launched_before(
        &self,
        run_id: String,
        spec: &RunSpec,
        request_id: &str,
    ) -> Result<LaunchRunResponse, GatewayError> {
        let existing = self.progress(&run_id).await?;
        if existing.spec.as_ref() != Some(spec) {
            return Err(GatewayError::AlreadyExists(format!(
                "request_id: {request_id:?} already launched {run_id} with a different request"
            )));
        }
        tracing::info!(run_id, "launch replayed; run already exists");
        Ok(LaunchRunResponse {
            run_id,
            created: false,
        })
    }
}

/// A delivery the tenant could never make is refused at launch, nothing started: the
/// remote's host not allowed, no git credential of the tenant's for it (nothing could be
/// pushed), or no forge API for its pull requests.
async fn check_delivery_access(
    repos: &crate::repo_policy::RepoPolicy,
    tenant: &str,
    repo: &str,
    d: &Delivery,
) -> Result<(), GatewayError> {
    let target = if d.remote.is_empty() { repo } else { &d.remote };
    let Ok(RepoLocation::Remote(remote)) = repo_location::locate(target) else {
        return Err(GatewayError::field(
            "delivery.remote",
            "is not a remote repository",
        ));
    };
    if !repos.git_hosts.admits(&remote.host, remote.port) {
        return Err(GatewayError::field(
            "delivery.remote",
            format!(
                "{} is not a git host runs may push to here (the operator lists them in {})",
                remote.host,
                repos.git_hosts.setting()
            ),
        ));
    }
    let none = |what: &str| {
        GatewayError::FailedPrecondition(format!(
            "delivery.{what}: tenant {tenant} has no git credentials for {} (the operator gives them in FORKYARD_GIT_CREDENTIALS)",
            remote.host
        ))
    };
    match repos.credentials.resolve(tenant, &remote).await {
        Ok(Some(_)) => {}
        Ok(None) => return Err(none("push")),
        Err(why) => {
            return Err(GatewayError::FailedPrecondition(format!(
                "delivery.push: {why}"
            )));
        }
    }
    let opens = !matches!(
        d.pull_requests(),
        PullRequests::Unspecified | PullRequests::None
    );
    if opens {
        match repos.credentials.forge_for(tenant, &remote).await {
            Ok(Some(_)) => {}
            Ok(None) => {
                return Err(GatewayError::FailedPrecondition(format!(
                    "delivery.pull_requests: no forge api for {} with tenant {tenant}'s credentials (an entry's forge and api in FORKYARD_GIT_CREDENTIALS; github.com and gitlab.com have theirs)",
                    remote.host
                )));
            }
            Err(e) => {
                return Err(GatewayError::FailedPrecondition(format!(
                    "delivery.pull_requests: {e}"
                )));
            }
        }
    }
    Ok(())
}

impl GatewayService {
    /// The run's backend, or each of its backends, resolved (the operator's default
    /// filled in, the tenant's policy and the provisioners' offer checked), then what
    /// those backends cannot give it refused at launch rather than at each fork's create.
    async fn admit_backends(
        &self,
        tenant: &Tenant,
        spec: &mut RunSpec,
    ) -> Result<(), GatewayError> {
        let policy = &self.tenancy.backends;
        if spec.backends.is_empty() {
            spec.backend = policy.resolve(&tenant.name, &spec.backend).await?;
        } else {
            spec.backends = policy.resolve_list(&tenant.name, &spec.backends).await?;
            // What runs of one backend, and builds that know no list, read.
            spec.backend.clone_from(&spec.backends[0].name);
        }
        check_on_backend(spec)?;
        for name in run_backends(spec) {
            policy.check_isolation(name, &spec.isolation).await?;
        }
        Ok(())
    }
}

/// Every backend the run's forks may land on.
fn run_backends(spec: &RunSpec) -> Vec<&str> {
    if spec.backends.is_empty() {
        vec![spec.backend.as_str()]
    } else {
        spec.backends.iter().map(|b| b.name.as_str()).collect()
    }
}

/// What the e2b backend cannot give a run, refused at launch naming the field (the
/// provisioner would refuse each fork's create): an egress entry E2B's network rules
/// cannot express (an IPv6 or internal address, `localhost`:
/// `forkyard_common::e2b_egress`; the rest become those rules), an isolation level
/// (E2B's sandboxes are its microVMs) and a branch window or a search (branches start
/// from local snapshots). A run over several backends is refused these when any of them is e2b.
fn check_on_backend(spec: &RunSpec) -> Result<(), GatewayError> {
    if !run_backends(spec).contains(&"e2b") {
        return Ok(());
    }
    for entry in &spec.egress {
        forkyard_common::e2b_egress::allow_out(entry)
            .map_err(|why| GatewayError::field("egress", format!("{why} (backend e2b)")))?;
    }
    if !spec.isolation.is_empty() {
        return Err(GatewayError::field(
            "isolation",
            "applies to the local backend only (an e2b sandbox is E2B's own microVM)",
        ));
    }
    // Branches are made from the provisioner's own snapshots of local workspaces.
    if spec.search.is_some() {
        return Err(GatewayError::field(
            "search",
            "fork trees run on the local backend only (no e2b snapshots yet)",
        ));
    }
    if spec.branch_window_secs > 0 {
        return Err(GatewayError::field(
            "branch_window_secs",
            "fork trees run on the local backend only (no e2b snapshots yet)",
        ));
    }
    Ok(())
}

/// The most forks the run may have in flight at once, which its tenant's limit counts:
/// its `max_concurrent` (already no more than its forks, unless it is open for branches,
/// whose forks may grow to it). A run in its branch window holds them while idle: the
/// count errs high, never low.
fn fork_slots(spec: &RunSpec) -> u32 {
    if crate::validate::grows(spec) {
        spec.max_concurrent
    } else {
        spec.max_concurrent.min(spec.forks)
    }
}

/// A new run id, or the one the request id names (for this tenant).
fn launch_run_id(tenant: &Tenant, request_id: &str) -> Result<String, GatewayError> {
    if request_id.is_empty() {
        Ok(format!("run-{}", uuid::Uuid::new_v4().simple()))
    } else {
        validate::run_id_for(request_id)?;
        Ok(tenant.run_id_for(request_id))
    }
}

/// RejectDuplicate: a request id names one run forever, even after it closed.
/// Eager start: this gateway's own worker (it polls the orchestration queue) takes
/// the run's first workflow task from the start's answer, with no trip through
/// matching; when it has no free slot, the server dispatches the task as usual.
fn start_options(tenant: &Tenant, run_id: &str, spec: &RunSpec) -> WorkflowStartOptions {
    let mut labels: Vec<String> = spec
        .labels
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    labels.sort();
    WorkflowStartOptions::new(queues::ORCHESTRATION, run_id.to_owned())
        .id_reuse_policy(WorkflowIdReusePolicy::RejectDuplicate)
        .enable_eager_workflow_start(true)
        .search_attributes(SearchAttributes::new([
            crate::workflows::LABELS_ATTR.value_set(labels),
            search::TENANT_ATTR.value_set(tenant.name.clone()),
            search::FORK_SLOTS_ATTR.value_set(i64::from(fork_slots(spec))),
        ]))
        .build()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What E2B cannot give is refused at launch naming the field; local takes both.
    #[test]
    fn what_e2b_cannot_express_is_refused_naming_the_field() {
        let spec = |backend: &str, egress: &[&str], isolation: &str| RunSpec {
            backend: backend.into(),
            egress: egress.iter().map(|e| (*e).to_owned()).collect(),
            isolation: isolation.into(),
            ..Default::default()
        };
        let field = |s: RunSpec| match check_on_backend(&s) {
            Err(GatewayError::InvalidArgument(m)) => m.split(':').next().unwrap().to_owned(),
            other => panic!("{other:?}"),
        };
        // Hosts, ports and wildcards map onto E2B's network rules.
        let egress = ["pypi.org", "*.github.com:443", "1.1.1.1"];
        assert!(check_on_backend(&spec("e2b", &egress, "")).is_ok());
        // An operator-listed private address, IPv6: not rules E2B keeps.
        assert_eq!(field(spec("e2b", &["pypi.org", "10.0.0.7"], "")), "egress");
        assert_eq!(field(spec("e2b", &["[2606:4700::1111]:443"], "")), "egress");
        let mixed = RunSpec {
            backends: vec![forkyard_proto::gateway::v1::BackendShare {
                name: "e2b".into(),
                ..Default::default()
            }],
            ..spec("local", &["10.0.0.7"], "")
        };
        assert_eq!(field(mixed), "egress");
        assert_eq!(field(spec("e2b", &[], "gvisor")), "isolation");
        let branchable = RunSpec {
            branch_window_secs: 60,
            ..spec("e2b", &[], "")
        };
        assert_eq!(field(branchable), "branch_window_secs");
        assert!(check_on_backend(&spec("e2b", &[], "")).is_ok());
        assert!(check_on_backend(&spec("local", &["10.0.0.7"], "gvisor")).is_ok());
    }
}
