//! `LaunchRun` input checks. Every refusal names the field; nothing starts on refusal.

mod agent;
mod backends;
mod delivery;
mod fields;
pub mod follow_up;
mod search;
#[cfg(test)]
mod tests;

use crate::error::GatewayError;
use fields::{check_branch, check_image, check_labels, command_size, field, no_nul, timeout_secs};
use forkyard_proto::Usd;
use forkyard_proto::gateway::v1::{LaunchRunRequest, RunSpec};

pub use agent::driver_refusal;
pub use delivery::publish_delivery;
pub(crate) use fields::check_base_ref;
pub use search::{grows, planned_forks};

pub const DEFAULT_BRANCH: &str = "forkyard";
pub const DEFAULT_FORK_TIMEOUT_SECS: u32 = 600;
pub const DEFAULT_VERIFY_TIMEOUT_SECS: u32 = 600;
/// The prompt reaches the agent as one environment variable, and Linux caps a single
/// argument or variable at 128 KiB; 64 KiB leaves room for the rest of the command line.
pub const MAX_PROMPT_BYTES: usize = 64 << 10;
/// Pending child workflows per run stay far below Temporal's 2,000 limit.
pub const MAX_CONCURRENT_FORKS: u32 = 500;

/// Runs of up to this many forks run their forks inside the run's workflow by default:
/// every run the default `--max-forks` allows.
pub const DEFAULT_INLINE_FORK_LIMIT: u32 = 1000;
/// The most `--inline-fork-limit` may be: the most forks a run may have. The run's
/// history holds each inline fork's agent events and what it keeps of its patch and
/// outputs, which shrinks as runs grow past 300 forks (`workflows::inline`).
pub const MAX_INLINE_FORK_LIMIT: u32 = 1300;

#[derive(Debug, Clone)]
pub struct Limits {
    pub max_forks: u32,
    /// Runs of up to this many forks run them inline (`RunSpec::inline_forks`); larger
    /// runs give each fork a child workflow.
    pub inline_fork_limit: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_forks: 1000,
            inline_fork_limit: DEFAULT_INLINE_FORK_LIMIT,
        }
    }
}

/// The run id for a request id: stable, so a retried launch finds the same run.
pub fn run_id_for(request_id: &str) -> Result<String, GatewayError> {
    let ok = !request_id.is_empty()
        && request_id.len() <= 128
        && request_id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
    if !ok {
        return Err(field(
            "request_id",
            "must be 1-128 characters of [A-Za-z0-9._-]",
        ));
    }
    Ok(format!("run-{request_id}"))
}

pub fn check_run_id(run_id: &str) -> Result<(), GatewayError> {
    if run_id.is_empty() {
        return Err(field("run_id", "is empty"));
    }
    if !run_id.starts_with("run-") || run_id.len() > 132 {
        return Err(GatewayError::RunNotFound(run_id.to_owned()));
    }
    Ok(())
}

/// Everything that can be checked without touching the repository. The steps run in
/// this order, so a request bad in several fields is refused for the first of them.
pub fn launch_spec(req: &LaunchRunRequest, limits: &Limits) -> Result<RunSpec, GatewayError> {
    check_texts(req)?;
    check_fork_counts(req, limits)?;
    let search = search::check(req, limits)?;
    let planned = planned_forks(req.forks, search.as_ref());
    let budget = budget(req, planned)?;
    let verify_timeout_secs = check_verify(req)?;
    let branch = if req.branch.is_empty() {
        DEFAULT_BRANCH.to_owned()
    } else {
        req.branch.clone()
    };
    check_branch(&branch)?;
    let fork_timeout_secs = timeout_secs(
        "fork_timeout_secs",
        req.fork_timeout_secs,
        DEFAULT_FORK_TIMEOUT_SECS,
    )?;
    check_labels(&req.labels)?;
    check_image(&req.image)?;
    check_isolation(&req.isolation)?;
    let (backend, backends) = backends::check(req)?;
    let agent = agent::check_agent(req.agent.as_ref())?;
    // A run that grows past its launch's forks (branches, a search's later rounds) may
    // run as many at once as asked for, not one at a time.
    let grows = req.branch_window_secs > 0 || search.is_some();
    Ok(RunSpec {
        repo: req.repo.trim().to_owned(),
        base_ref: req.base_ref.clone(),
        branch,
        prompt: req.prompt.clone(),
        forks: req.forks,
        max_concurrent: if grows {
            req.max_concurrent
        } else {
            req.max_concurrent.min(req.forks)
        },
        budget_micros: budget.run_micros,
        agent: Some(agent),
        fork_timeout_secs,
        labels: req.labels.clone(),
        verify_command: req.verify_command.clone(),
        verify_timeout_secs,
        stop_on_first_verified: req.stop_on_first_verified,
        fork_budget_micros: budget.fork_micros,
        // The gateway sets the caller's tenant after validation.
        tenant: String::new(),
        tenant_account_id: String::new(),
        inline_forks: planned <= u64::from(limits.inline_fork_limit),
        // The gateway sets the allowed hosts after checking them against the tenant's
        // policy (api::egress).
        egress: Vec::new(),
        image: req.image.clone(),
        delivery: delivery::check_delivery(req)?,
        isolation: req.isolation.trim().to_owned(),
        // Empty until admitted: the operator's default is filled in then
        // (`crate::backend_policy`), with what the provisioners offer.
        backend,
        backends,
        branch_window_secs: check_branch_window(req.branch_window_secs)?,
        search,
    })
}

/// The longest a run stays open for branches after its last fork (a day).
const MAX_BRANCH_WINDOW_SECS: u32 = 86_400;

fn check_branch_window(secs: u32) -> Result<u32, GatewayError> {
    if secs > MAX_BRANCH_WINDOW_SECS {
        return Err(field(
            "branch_window_secs",
            format!("{secs} is above the limit of {MAX_BRANCH_WINDOW_SECS} (a day)"),
        ));
    }
    Ok(secs)
}

/// One of the isolation levels a sandbox can have (`forkyard_proto::ISOLATIONS`), or
/// empty for the provisioners' default.
fn check_isolation(isolation: &str) -> Result<(), GatewayError> {
    let name = isolation.trim();
    if name.is_empty() || forkyard_proto::ISOLATIONS.contains(&name) {
        return Ok(());
    }
    Err(field(
        "isolation",
        format!(
            "{name:?} is not an isolation level (one of: {})",
            forkyard_proto::ISOLATIONS.join(", ")
        ),
    ))
}

/// The repository, the prompt and the base ref: present, within bounds, without NUL.
fn check_texts(req: &LaunchRunRequest) -> Result<(), GatewayError> {
    if req.repo.trim().is_empty() {
        return Err(field("repo", "is empty; give a git URL or a local path"));
    }
    if req.prompt.trim().is_empty() {
        return Err(field("prompt", "is empty"));
    }
    if req.prompt.len() > MAX_PROMPT_BYTES {
        return Err(field(
            "prompt",
            format!(
                "is {} bytes; the limit is {MAX_PROMPT_BYTES}",
                req.prompt.len()
            ),
        ));
    }
    no_nul("prompt", &req.prompt)?;
    no_nul("repo", &req.repo)?;
    no_nul("base_ref", &req.base_ref)?;
    check_base_ref(&req.base_ref)
}

/// How many forks, and how many at once.
fn check_fork_counts(req: &LaunchRunRequest, limits: &Limits) -> Result<(), GatewayError> {
    if req.forks == 0 {
        return Err(field("forks", "must be at least 1"));
    }
    if req.forks > limits.max_forks {
        return Err(field(
            "forks",
            format!(
                "{} is above the limit of {} forks per run",
                req.forks, limits.max_forks
            ),
        ));
    }
    if req.max_concurrent == 0 {
        return Err(field("max_concurrent", "must be at least 1"));
    }
    if req.max_concurrent > MAX_CONCURRENT_FORKS {
        return Err(field(
            "max_concurrent",
            format!(
                "{} is above the limit of {MAX_CONCURRENT_FORKS}",
                req.max_concurrent
            ),
        ));
    }
    Ok(())
}

/// The run's budget and each fork's share of it, in micro-USD.
struct Budget {
    run_micros: i64,
    fork_micros: i64,
}

/// The run's budget, and each fork's: as asked, or the run's shared evenly among its
/// forks: the `planned` forks of a search (every round's), and for a run open for
/// branches, among as many as may run at once when more, so its branches are not held
/// to one at a time by a first one's reservation of it all.
fn budget(req: &LaunchRunRequest, planned: u64) -> Result<Budget, GatewayError> {
    let planned = u32::try_from(planned).unwrap_or(u32::MAX);
    let shares = if req.branch_window_secs > 0 {
        planned.max(req.max_concurrent).max(1)
    } else {
        planned.max(1)
    };
    let budget_micros = Usd::parse(&req.budget_usd)
        .map_err(|e| field("budget_usd", e))?
        .micros();
    if budget_micros == 0 {
        return Err(field("budget_usd", "must be more than 0"));
    }
    let fork_budget_micros = if req.fork_budget_usd.trim().is_empty() {
        budget_micros / i64::from(shares)
    } else {
        let f = Usd::parse(&req.fork_budget_usd)
            .map_err(|e| field("fork_budget_usd", e))?
            .micros();
        if f > budget_micros {
            return Err(field(
                "fork_budget_usd",
                format!(
                    "{} is more than the run's budget",
                    req.fork_budget_usd.trim()
                ),
            ));
        }
        f
    };
    if fork_budget_micros == 0 {
        return Err(field(
            "budget_usd",
            format!(
                "{} is too small to give each of the {shares} forks a budget",
                req.budget_usd.trim(),
            ),
        ));
    }
    Ok(Budget {
        run_micros: budget_micros,
        fork_micros: fork_budget_micros,
    })
}

/// The verify command and what depends on it; its timeout in seconds.
fn check_verify(req: &LaunchRunRequest) -> Result<u32, GatewayError> {
    no_nul("verify_command", &req.verify_command)?;
    command_size("verify_command", &req.verify_command)?;
    if req.stop_on_first_verified && req.verify_command.trim().is_empty() {
        return Err(field("stop_on_first_verified", "needs a verify_command"));
    }
    timeout_secs(
        "verify_timeout_secs",
        req.verify_timeout_secs,
        DEFAULT_VERIFY_TIMEOUT_SECS,
    )
}

pub use crate::repo_check::check_repo;
