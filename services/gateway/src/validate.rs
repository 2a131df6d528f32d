//! `LaunchRun` input checks. Every refusal names the field; nothing starts on refusal.

use crate::{error::GatewayError, money::parse_usd};
use forkyard_proto::{
    common::v1::AgentSpec,
    gateway::v1::{LaunchRunRequest, RunSpec},
};

pub const DEFAULT_BRANCH: &str = "forkyard";
pub const DEFAULT_FORK_TIMEOUT_SECS: u32 = 600;
pub const DEFAULT_VERIFY_TIMEOUT_SECS: u32 = 600;
const MAX_FORK_TIMEOUT_SECS: u32 = 24 * 3600;
/// The prompt reaches the agent as one environment variable, and Linux caps a single
/// argument or variable at 128 KiB; 64 KiB leaves room for the rest of the command line.
pub const MAX_PROMPT_BYTES: usize = 64 << 10;
const MAX_COMMAND_BYTES: usize = 16 << 10;
/// Pending child workflows per run stay far below Temporal's 2,000 limit.
pub const MAX_CONCURRENT_FORKS: u32 = 500;
const MAX_LABELS: usize = 64;
/// Drivers agent-runner implements. Whether the runner can run one (its model alias,
/// its API key) is asked of the runner at launch (`api::agents`).
pub const DRIVERS: &[&str] = &["command", "claude-code", "codex", "anthropic", "openai"];
/// Most entries of `agent.allowed_models`.
const MAX_ALLOWED_MODELS: usize = 32;

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

pub(crate) fn field(name: &str, msg: impl std::fmt::Display) -> GatewayError {
    GatewayError::field(name, msg)
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

/// A conservative subset of git's ref rules, so every `<branch>-fork-<n>` is valid too.
fn check_branch(branch: &str) -> Result<(), GatewayError> {
    let component_ok = |c: &str| !c.is_empty() && !c.starts_with('.') && !c.ends_with(".lock");
    let ok = branch.len() <= 100
        && !branch.starts_with(['-', '/'])
        && !branch.ends_with(['/', '.'])
        && !branch.contains("..")
        && branch.split('/').all(component_ok)
        && branch
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._/-".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(field(
            "branch",
            format!("{branch:?} is not a valid git branch name"),
        ))
    }
}

/// A commit-ish git could read: no option look-alike, no whitespace or control
/// characters (whether it names a commit is asked of the repository: [`check_repo`]).
pub(crate) fn check_base_ref(base_ref: &str) -> Result<(), GatewayError> {
    let ok = base_ref.len() <= 256
        && !base_ref.starts_with('-')
        && !base_ref
            .chars()
            .any(|c| c.is_whitespace() || c.is_control());
    if ok {
        Ok(())
    } else {
        Err(field(
            "base_ref",
            format!("{base_ref:?} is not a commit, branch or tag name"),
        ))
    }
}

/// Text that travels into a sandbox or a command line cannot hold NUL bytes.
fn no_nul(name: &str, value: &str) -> Result<(), GatewayError> {
    if value.contains('\0') {
        Err(field(name, "contains a NUL byte"))
    } else {
        Ok(())
    }
}

fn check_agent(agent: Option<&AgentSpec>) -> Result<AgentSpec, GatewayError> {
    let agent = agent.cloned().unwrap_or_default();
    let driver = if agent.driver.is_empty() {
        "command"
    } else {
        agent.driver.as_str()
    };
    if !DRIVERS.contains(&driver) {
        return Err(field(
            "agent.driver",
            format!(
                "unknown driver {driver:?}; available: {}",
                DRIVERS.join(", ")
            ),
        ));
    }
    if driver == "command" && agent.command.trim().is_empty() {
        return Err(field(
            "agent.command",
            "is empty; the command driver needs a shell command to run",
        ));
    }
    if agent.command.len() > MAX_COMMAND_BYTES {
        return Err(field(
            "agent.command",
            format!(
                "is {} bytes; the limit is {MAX_COMMAND_BYTES}",
                agent.command.len()
            ),
        ));
    }
    no_nul("agent.command", &agent.command)?;
    no_nul("agent.model", &agent.model)?;
    if agent.allowed_models.len() > MAX_ALLOWED_MODELS {
        return Err(field(
            "agent.allowed_models",
            format!(
                "{} models; the limit is {MAX_ALLOWED_MODELS}",
                agent.allowed_models.len()
            ),
        ));
    }
    for m in &agent.allowed_models {
        let ok = !m.trim().is_empty()
            && m.len() <= 200
            && !m.chars().any(|c| c.is_control() || c.is_whitespace());
        if !ok {
            return Err(field(
                "agent.allowed_models",
                format!("{m:?} is not a model name"),
            ));
        }
    }
    Ok(AgentSpec {
        driver: driver.to_owned(),
        ..agent
    })
}

/// Everything that can be checked without touching the repository.
pub fn launch_spec(req: &LaunchRunRequest, limits: &Limits) -> Result<RunSpec, GatewayError> {
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
    check_base_ref(&req.base_ref)?;
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
    let budget_micros = parse_usd(&req.budget_usd).map_err(|e| field("budget_usd", e))?;
    if budget_micros == 0 {
        return Err(field("budget_usd", "must be more than 0"));
    }
    let fork_budget_micros = if req.fork_budget_usd.trim().is_empty() {
        budget_micros / i64::from(req.forks)
    } else {
        let f = parse_usd(&req.fork_budget_usd).map_err(|e| field("fork_budget_usd", e))?;
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
                "{} is too small to give each of the {} forks a budget",
                req.budget_usd.trim(),
                req.forks
            ),
        ));
    }
    no_nul("verify_command", &req.verify_command)?;
    if req.verify_command.len() > MAX_COMMAND_BYTES {
        return Err(field(
            "verify_command",
            format!(
                "is {} bytes; the limit is {MAX_COMMAND_BYTES}",
                req.verify_command.len()
            ),
        ));
    }
    if req.stop_on_first_verified && req.verify_command.trim().is_empty() {
        return Err(field("stop_on_first_verified", "needs a verify_command"));
    }
    let verify_timeout_secs = match req.verify_timeout_secs {
        0 => DEFAULT_VERIFY_TIMEOUT_SECS,
        t if t > MAX_FORK_TIMEOUT_SECS => {
            return Err(field(
                "verify_timeout_secs",
                format!("{t} is above the limit of {MAX_FORK_TIMEOUT_SECS}"),
            ));
        }
        t => t,
    };
    let branch = if req.branch.is_empty() {
        DEFAULT_BRANCH.to_owned()
    } else {
        req.branch.clone()
    };
    check_branch(&branch)?;
    let fork_timeout_secs = match req.fork_timeout_secs {
        0 => DEFAULT_FORK_TIMEOUT_SECS,
        t if t > MAX_FORK_TIMEOUT_SECS => {
            return Err(field(
                "fork_timeout_secs",
                format!("{t} is above the limit of {MAX_FORK_TIMEOUT_SECS}"),
            ));
        }
        t => t,
    };
    if req.labels.len() > MAX_LABELS {
        return Err(field(
            "labels",
            format!("{} labels; the limit is {MAX_LABELS}", req.labels.len()),
        ));
    }
    for (k, v) in &req.labels {
        let key_ok = !k.is_empty()
            && k.len() <= 63
            && k.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._/-".contains(&b));
        let value_ok = v.len() <= 256 && !v.contains(['\0', '\'']);
        if !key_ok || !value_ok {
            return Err(field(
                "labels",
                format!(
                    "label {k:?}: keys are 1-63 characters of [A-Za-z0-9._/-], values at most 256 bytes without quotes or NUL"
                ),
            ));
        }
    }
    if !req.image.is_empty() {
        forkyard_common::image_reference::parse(&req.image).map_err(|e| field("image", e))?;
    }
    Ok(RunSpec {
        repo: req.repo.trim().to_owned(),
        base_ref: req.base_ref.clone(),
        branch,
        prompt: req.prompt.clone(),
        forks: req.forks,
        max_concurrent: req.max_concurrent.min(req.forks),
        budget_micros,
        agent: Some(check_agent(req.agent.as_ref())?),
        fork_timeout_secs,
        labels: req.labels.clone(),
        verify_command: req.verify_command.clone(),
        verify_timeout_secs,
        stop_on_first_verified: req.stop_on_first_verified,
        fork_budget_micros,
        // The gateway sets the caller's tenant after validation.
        tenant: String::new(),
        tenant_account_id: String::new(),
        inline_forks: req.forks <= limits.inline_fork_limit,
        // The gateway sets the allowed hosts after checking them against the tenant's
        // policy (api::egress).
        egress: Vec::new(),
        image: req.image.clone(),
    })
}

pub use crate::repo_check::check_repo;

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::Code;

    fn ok_req() -> LaunchRunRequest {
        LaunchRunRequest {
            repo: "/tmp/x".into(),
            prompt: "do it".into(),
            forks: 3,
            max_concurrent: 2,
            budget_usd: "1".into(),
            agent: Some(AgentSpec {
                driver: "command".into(),
                command: "true".into(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn refused(req: LaunchRunRequest, field_name: &str) {
        let err = launch_spec(&req, &Limits::default()).expect_err("accepted bad input");
        let status = tonic::Status::from(err);
        assert_eq!(status.code(), Code::InvalidArgument);
        assert!(
            status.message().starts_with(field_name),
            "{:?} does not name {field_name}",
            status.message()
        );
    }

    #[test]
    fn accepts_a_good_request_with_defaults() {
        let spec = launch_spec(&ok_req(), &Limits::default()).unwrap();
        assert_eq!(spec.branch, "forkyard");
        assert_eq!(spec.fork_timeout_secs, DEFAULT_FORK_TIMEOUT_SECS);
        assert_eq!(spec.budget_micros, 1_000_000);
        assert_eq!(
            spec.fork_budget_micros, 333_333,
            "budget shared evenly by default"
        );
        assert_eq!(spec.verify_timeout_secs, DEFAULT_VERIFY_TIMEOUT_SECS);
    }

    #[test]
    fn bad_input_names_the_field() {
        refused(
            LaunchRunRequest {
                forks: 0,
                ..ok_req()
            },
            "forks",
        );
        refused(
            LaunchRunRequest {
                forks: 5000,
                ..ok_req()
            },
            "forks",
        );
        refused(
            LaunchRunRequest {
                prompt: " ".into(),
                ..ok_req()
            },
            "prompt",
        );
        refused(
            LaunchRunRequest {
                max_concurrent: 0,
                ..ok_req()
            },
            "max_concurrent",
        );
        refused(
            LaunchRunRequest {
                budget_usd: "-5".into(),
                ..ok_req()
            },
            "budget_usd",
        );
        refused(
            LaunchRunRequest {
                budget_usd: String::new(),
                ..ok_req()
            },
            "budget_usd",
        );
        refused(
            LaunchRunRequest {
                repo: String::new(),
                ..ok_req()
            },
            "repo",
        );
        refused(
            LaunchRunRequest {
                branch: "a..b".into(),
                ..ok_req()
            },
            "branch",
        );
        let mut r = ok_req();
        r.agent.as_mut().unwrap().driver = "gpt-pilot".into();
        refused(r, "agent.driver");
        let mut r = ok_req();
        r.agent.as_mut().unwrap().command = String::new();
        refused(r, "agent.command");
    }

    #[test]
    fn request_ids_map_to_stable_run_ids() {
        assert_eq!(run_id_for("abc-1").unwrap(), "run-abc-1");
        assert!(run_id_for("has space").is_err());
        assert!(run_id_for("").is_err());
    }
}
