//! BranchFork (fork trees, #45): a finished fork of a run open for branches continued
//! by `count` new forks of the run, through the run's `branch_fork` update. The call is
//! checked here first, against the run's `progress`, so that each refusal has its
//! status code (the update's validator checks the same again, for races, and a refusal
//! there is FAILED_PRECONDITION); then the update makes the branches durable and
//! returns their numbers. A running fork is captured first, at its next model request
//! (`branch_point`). See `workflows::branching`.

use super::GatewayService;
use crate::auth::Access;
use crate::{
    auth::Tenant,
    error::GatewayError,
    validate::driver_refusal,
    workflows::{
        SandboxOrchestrationWorkflow,
        branching::{BranchRequest, is_finished},
    },
};
use forkyard_proto::{
    Driver,
    common::v1::{ForkResult, ForkStatus},
    gateway::v1::{BranchForkRequest, BranchForkResponse, Run, RunSpec, RunState},
};
use temporalio_client::{WorkflowExecuteUpdateOptions, errors::WorkflowUpdateError};

/// The longest prompt a branch may have (as LaunchRun's).
const MAX_PROMPT_BYTES: usize = 256 * 1024;

impl GatewayService {
    pub(super) async fn branch(
        &self,
        tenant: &Tenant,
        req: BranchForkRequest,
    ) -> Result<BranchForkResponse, GatewayError> {
        check_request(&req)?;
        let (state, ..) = self.describe(tenant, &req.run_id, Access::Change).await?;
        if !matches!(
            state,
            RunState::Running | RunState::Paused | RunState::AwaitingBudget
        ) {
            return Err(GatewayError::FailedPrecondition(format!(
                "run {} has ended ({}): a fork is branched while its run is open (its branch window)",
                req.run_id,
                state.as_str_name()
            )));
        }
        let run = self.progress(&req.run_id).await?;
        let max_forks = self.branch_limit(&run);
        let point = match check_against_run(&run, &req, max_forks)? {
            From::End => None,
            From::Running => Some(self.capture_point(&req.run_id, &run, req.fork).await?),
        };
        let update = BranchRequest {
            fork: req.fork,
            count: req.count,
            prompt: req.prompt.clone(),
            max_forks,
            point,
        };
        let forks = self
            .handle(&req.run_id)
            .execute_update(
                SandboxOrchestrationWorkflow::branch_fork,
                update,
                WorkflowExecuteUpdateOptions::default(),
            )
            .await
            .map_err(|e| match e {
                WorkflowUpdateError::NotFound(_) => GatewayError::RunNotFound(req.run_id.clone()),
                WorkflowUpdateError::Failed(f) => {
                    GatewayError::FailedPrecondition(format!("branch fork: {}", f.message))
                }
                other => GatewayError::Temporal(other.to_string()),
            })?;
        self.reads.forget(&req.run_id);
        tracing::info!(run_id = %req.run_id, fork = req.fork, branches = ?forks, "fork branched");
        Ok(BranchForkResponse { forks })
    }

    /// The most forks the run may have with its branches: the gateway's per-run limit,
    /// and for a run whose forks run inline, the inline limit (its history's budget).
    fn branch_limit(&self, run: &Run) -> u32 {
        let inline = run.spec.as_ref().is_some_and(|s| s.inline_forks);
        if inline {
            self.limits.max_forks.min(self.limits.inline_fork_limit)
        } else {
            self.limits.max_forks
        }
    }
}

/// The request's own fields.
fn check_request(req: &BranchForkRequest) -> Result<(), GatewayError> {
    crate::validate::check_run_id(&req.run_id)?;
    if req.fork == 0 {
        return Err(GatewayError::field("fork", "forks are numbered from 1"));
    }
    if req.count == 0 {
        return Err(GatewayError::field("count", "must be at least 1"));
    }
    if req.prompt.len() > MAX_PROMPT_BYTES {
        return Err(GatewayError::field(
            "prompt",
            format!(
                "is {} bytes; the limit is {MAX_PROMPT_BYTES}",
                req.prompt.len()
            ),
        ));
    }
    if req.prompt.contains('\0') {
        return Err(GatewayError::field("prompt", "contains a NUL byte"));
    }
    Ok(())
}

/// Where a branch starts in its parent.
#[derive(Debug, PartialEq, Eq)]
enum From {
    /// Its end (a finished fork's snapshot).
    End,
    /// Its next model request (a running fork, captured before the update).
    Running,
}

/// The request against the run as it is: the fork exists and has finished with a branch
/// point or is running, the run allows branches, its driver can resume, the count fits.
fn check_against_run(
    run: &Run,
    req: &BranchForkRequest,
    max_forks: u32,
) -> Result<From, GatewayError> {
    let spec = run.spec.clone().unwrap_or_default();
    let Some(parent) = run.forks.get(req.fork as usize - 1) else {
        return Err(GatewayError::field(
            "fork",
            format!(
                "the run has no fork {} (it has {})",
                req.fork,
                run.forks.len()
            ),
        ));
    };
    let total = run.forks.len() as u64 + u64::from(req.count);
    if total > u64::from(max_forks) {
        return Err(GatewayError::field(
            "count",
            format!("the run would have {total} forks, more than its limit of {max_forks}"),
        ));
    }
    let precondition = |m: String| Err(GatewayError::FailedPrecondition(m));
    if spec.branch_window_secs == 0 {
        return precondition(
            "the run was launched without branch_window_secs: its forks cannot be branched".into(),
        );
    }
    if let Some(why) = driver_refusal(spec.agent.as_ref().map_or("", |a| a.driver.as_str())) {
        return precondition(why);
    }
    if parent.status == ForkStatus::Running as i32 {
        return Ok(From::Running);
    }
    if parent.status == ForkStatus::Pending as i32 {
        return precondition(format!(
            "fork {} has not started (PENDING): a running fork is branched at its next model turn, a finished one at its end",
            req.fork
        ));
    }
    if !is_finished(parent.status) {
        let status = ForkStatus::try_from(parent.status).unwrap_or_default();
        return precondition(format!(
            "fork {} ended {}: it left no branch point",
            req.fork,
            status.as_str_name().trim_start_matches("FORK_STATUS_")
        ));
    }
    if parent.snapshot_id.is_empty() {
        return precondition(format!(
            "fork {} has no snapshot of its end to branch from",
            req.fork
        ));
    }
    if let Some(why) = session_refusal(&spec, req.fork, parent) {
        return precondition(why);
    }
    Ok(From::End)
}

/// Why a finished fork's conversation cannot be continued, if it cannot: its driver
/// resumes a session (the CLIs', or the built-in loops' kept conversation) and its agent
/// left none (a CLI that printed no id, a loop that failed before its end), so a branch
/// would silently start a new conversation. Checked here only, not in the
/// update's validator: that one is also the update handler's check, which replays, and
/// such branches were accepted before; a finished fork's session never changes, so the
/// run's state read here cannot go stale in the meantime.
fn session_refusal(spec: &RunSpec, fork: u32, parent: &ForkResult) -> Option<String> {
    let driver = spec.agent.as_ref().map_or("", |a| a.driver.as_str());
    let resumes = Driver::parse(driver).is_some_and(|d| d.capabilities().resumable);
    (resumes && parent.agent_session.is_empty())
        .then(|| format!("fork {fork} has no agent session to continue (its agent left none)"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use forkyard_proto::common::v1::AgentSpec;

    /// A run of `driver` open for branches whose fork 1 failed with a snapshot and
    /// `session`.
    fn run(driver: &str, session: &str) -> Run {
        Run {
            spec: Some(RunSpec {
                branch_window_secs: 60,
                agent: Some(AgentSpec {
                    driver: driver.into(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            forks: vec![ForkResult {
                fork: 1,
                status: ForkStatus::Failed as i32,
                snapshot_id: "snap-1".into(),
                agent_session: session.into(),
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    fn req() -> BranchForkRequest {
        BranchForkRequest {
            run_id: "run-1".into(),
            fork: 1,
            count: 2,
            prompt: "again".into(),
        }
    }

    #[test]
    fn a_driver_without_a_session_to_resume_is_refused_before_anything_starts() {
        let id = "01a22a25-89af-7900-ba9a-ee556fd09337";
        for driver in ["claude-code", "codex", "anthropic", "openai"] {
            assert!(
                check_against_run(&run(driver, id), &req(), 10).is_ok(),
                "{driver}"
            );
            let err = check_against_run(&run(driver, ""), &req(), 10).unwrap_err();
            let status = tonic::Status::from(err);
            assert_eq!(status.code(), tonic::Code::FailedPrecondition, "{driver}");
            assert_eq!(
                status.message(),
                "fork 1 has no agent session to continue (its agent left none)"
            );
        }
        // A command fork has no session to continue: its workspace is the branch point.
        assert!(check_against_run(&run("command", ""), &req(), 10).is_ok());
    }

    #[test]
    fn a_running_fork_is_captured_a_pending_or_cancelled_one_is_refused() {
        let mut r = run("claude-code", "");
        r.forks[0].status = ForkStatus::Running as i32;
        // No session yet in the run's copy: the capture brings the agent's own.
        assert_eq!(check_against_run(&r, &req(), 10).unwrap(), From::Running);
        for (status, says) in [
            (ForkStatus::Pending, "fork 1 has not started (PENDING)"),
            (
                ForkStatus::Cancelled,
                "fork 1 ended CANCELLED: it left no branch point",
            ),
        ] {
            r.forks[0].status = status as i32;
            let s = tonic::Status::from(check_against_run(&r, &req(), 10).unwrap_err());
            assert_eq!(s.code(), tonic::Code::FailedPrecondition);
            assert!(s.message().starts_with(says), "{}", s.message());
        }
    }
}
