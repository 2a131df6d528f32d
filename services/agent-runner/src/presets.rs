//! What runs in the sandbox for the command-like drivers: `command` (the caller's shell
//! command), and the presets `claude-code` and `codex`, each the CLI's non-interactive
//! invocation wired to the LLM gateway. Every one gets the prompt in `FORKYARD_PROMPT`
//! (never on a command line the runner builds) and, with the gateway, the provider
//! variables pointing at it with the fork's token.

use crate::{error::AgentError, llm_gateway::grants::Allowed, models::Models};
use forkyard_proto::{Driver, SANDBOX_LLM_ADDR, agent::v1::RunAgentRequest, common::v1::AgentSpec};
use std::collections::{BTreeSet, HashMap};

/// Claude Code's tools a fork may use without asking (`-p` has nobody to ask). The
/// sandbox is the boundary; web tools only reach what the run's egress allows.
const CLAUDE_TOOLS: &str =
    "Bash Edit MultiEdit Write Read Glob Grep LS NotebookEdit TodoWrite Task WebFetch WebSearch";

/// The command-like drivers: a program run in the sandbox.
pub fn is_command_like(driver: &str) -> bool {
    Driver::parse(driver).is_some_and(|d| d.capabilities().in_sandbox)
}

/// The program to run and the model it uses.
#[derive(Debug, Clone, PartialEq)]
pub struct Program {
    /// Run as `sh -c <script>`.
    pub script: String,
    /// The model id (resolved from an alias); empty when the spec names none.
    pub model: String,
    pub env: HashMap<String, String>,
}

fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// The program `req` asks for; INVALID_ARGUMENT naming the field when it cannot be.
pub fn program(
    req: &RunAgentRequest,
    models: &Models,
    max_turns: u32,
) -> Result<Program, AgentError> {
    let agent = req
        .agent
        .as_ref()
        .ok_or_else(|| AgentError::InvalidArgument("agent: missing".into()))?;
    if req.sandbox_id.is_empty() {
        return Err(AgentError::InvalidArgument("sandbox_id: is empty".into()));
    }
    match Driver::parse(&agent.driver) {
        Some(Driver::Command) => command(agent),
        Some(Driver::ClaudeCode) => claude_code(req, agent, models, max_turns),
        Some(Driver::Codex) => codex(req, agent, models),
        _ => Err(AgentError::InvalidArgument(format!(
            "agent.driver: {:?} is not a command driver",
            agent.driver
        ))),
    }
}

fn bad_model(m: String) -> AgentError {
    AgentError::InvalidArgument(format!("agent.model: {m}"))
}

/// The caller's own shell command, as given.
fn command(agent: &AgentSpec) -> Result<Program, AgentError> {
    if agent.command.trim().is_empty() {
        return Err(AgentError::InvalidArgument(
            "agent.command: is empty".into(),
        ));
    }
    Ok(Program {
        script: agent.command.clone(),
        model: agent.model.clone(),
        env: HashMap::new(),
    })
}

/// `claude -p` with the spec's model (an Anthropic one) and turn limit (else the
/// runner's `max_turns`).
fn claude_code(
    req: &RunAgentRequest,
    agent: &AgentSpec,
    models: &Models,
    max_turns: u32,
) -> Result<Program, AgentError> {
    let model = models
        .resolve("anthropic", &agent.model)
        .map_err(bad_model)?;
    let turns = if agent.max_turns == 0 {
        max_turns
    } else {
        agent.max_turns
    };
    let mut env = HashMap::new();
    // Claude Code's background calls use the "small fast" model: the same one,
    // so a run's allowed list of one model holds.
    for var in [
        "ANTHROPIC_SMALL_FAST_MODEL",
        "ANTHROPIC_DEFAULT_HAIKU_MODEL",
    ] {
        env.insert(var.into(), model.clone());
    }
    for var in [
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC",
        "DISABLE_AUTOUPDATER",
        "DISABLE_TELEMETRY",
        "DISABLE_ERROR_REPORTING",
    ] {
        env.insert(var.into(), "1".into());
    }
    // Its home in the workspace's git directory: the session goes with a snapshot, so
    // a branch of this fork can resume it (`crate::branch`).
    env.insert(
        "CLAUDE_CONFIG_DIR".into(),
        crate::branch::CLAUDE_HOME.into(),
    );
    let script = format!(
        "exec claude -p \"$FORKYARD_PROMPT\"{} --output-format stream-json --verbose --model {} --max-turns {turns} --permission-mode acceptEdits --allowedTools {}",
        crate::branch::claude_resume_flags(req),
        shell_quote(&model),
        shell_quote(CLAUDE_TOOLS),
    );
    Ok(Program { script, model, env })
}

/// `codex exec` with the spec's model (an OpenAI one), else codex's own default; for a
/// branch, `codex exec fork` of its parent's session (`crate::branch`).
fn codex(req: &RunAgentRequest, agent: &AgentSpec, models: &Models) -> Result<Program, AgentError> {
    let model = if agent.model.trim().is_empty() {
        String::new()
    } else {
        models.resolve("openai", &agent.model).map_err(bad_model)?
    };
    let model_flag = if model.is_empty() {
        String::new()
    } else {
        format!(" -m {}", shell_quote(&model))
    };
    let (fork, session) = crate::branch::codex_fork_args(req);
    // A provider of Forkyard's own: codex's built-in one ignores a base URL and
    // tries OpenAI's websocket first. Codex's own sandbox stays off: the fork's
    // sandbox is the boundary, and a second one cannot start inside it.
    let script = format!(
        "mkdir -p \"$CODEX_HOME\" 2>/dev/null || unset CODEX_HOME; exec codex exec{fork} --json --skip-git-repo-check --dangerously-bypass-approvals-and-sandbox{model_flag} \
         -c model_provider=forkyard -c model_providers.forkyard.name=forkyard \
         -c \"model_providers.forkyard.base_url=$OPENAI_BASE_URL\" \
         -c model_providers.forkyard.env_key=OPENAI_API_KEY \
         -c model_providers.forkyard.wire_api=responses{session} \"$FORKYARD_PROMPT\""
    );
    // Its home in the workspace's git directory: the session goes with a snapshot, so
    // a branch of this fork can continue it. An image that brings codex and no `mkdir`
    // runs it in codex's own home instead (such a fork cannot be branched).
    let env = HashMap::from([(
        "CODEX_HOME".to_owned(),
        crate::branch::CODEX_HOME.to_owned(),
    )]);
    Ok(Program { script, model, env })
}

/// The models a fork's agent may ask the gateway for: the spec's list (aliases
/// resolved), else its model, else any.
pub fn allowed(agent: &AgentSpec, model: &str, models: &Models) -> Allowed {
    let listed: BTreeSet<String> = agent
        .allowed_models
        .iter()
        .map(|m| m.trim())
        .filter(|m| !m.is_empty())
        .map(|m| {
            models
                .aliases
                .get(m)
                .cloned()
                .unwrap_or_else(|| m.to_owned())
        })
        .collect();
    if !listed.is_empty() {
        return Allowed::Only(listed);
    }
    let model = if model.is_empty() {
        agent.model.trim()
    } else {
        model
    };
    if model.is_empty() {
        return Allowed::Any;
    }
    let id = models
        .aliases
        .get(model)
        .cloned()
        .unwrap_or_else(|| model.to_owned());
    Allowed::Only(BTreeSet::from([id]))
}

/// The provider variables every command-like driver's command gets with the gateway:
/// both clients' base URLs at the gateway (`public_url` for a sandbox off the mesh's
/// hosts, else the sandbox's own LLM address) and the fork's token as both keys.
pub fn gateway_env(token: &str, public_url: Option<&str>) -> HashMap<String, String> {
    let base = public_url.map_or_else(
        || format!("http://{SANDBOX_LLM_ADDR}"),
        |u| u.trim_end_matches('/').to_owned(),
    );
    let mut vars = HashMap::from([
        ("ANTHROPIC_BASE_URL".to_owned(), base.clone()),
        ("ANTHROPIC_API_KEY".to_owned(), token.to_owned()),
        ("OPENAI_BASE_URL".to_owned(), format!("{base}/v1")),
        ("OPENAI_API_KEY".to_owned(), token.to_owned()),
    ]);
    // A local sandbox's FORKYARD_LLM_URL is its relay's, set by the provisioner.
    if public_url.is_some() {
        vars.insert("FORKYARD_LLM_URL".to_owned(), base);
    }
    vars
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(driver: &str, model: &str) -> RunAgentRequest {
        RunAgentRequest {
            sandbox_id: "sbx-1".into(),
            agent: Some(AgentSpec {
                driver: driver.into(),
                model: model.into(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn presets_build_the_non_interactive_invocations() {
        let m = Models::default();
        let p = program(&req("claude-code", "sonnet"), &m, 7).unwrap();
        assert_eq!(p.model, "claude-sonnet-4-5");
        assert!(p.script.starts_with("exec claude -p \"$FORKYARD_PROMPT\" --output-format stream-json --verbose --model 'claude-sonnet-4-5' --max-turns 7"), "{}", p.script);
        assert_eq!(p.env["ANTHROPIC_SMALL_FAST_MODEL"], "claude-sonnet-4-5");
        let p = program(&req("codex", "gpt-5"), &m, 7).unwrap();
        assert!(
            p.script.starts_with(
                "mkdir -p \"$CODEX_HOME\" 2>/dev/null || unset CODEX_HOME; exec codex exec --json"
            ),
            "{}",
            p.script
        );
        assert!(p.script.contains(" -m 'gpt-5' "), "{}", p.script);
        assert!(
            p.script.ends_with("=responses \"$FORKYARD_PROMPT\""),
            "{}",
            p.script
        );
        assert_eq!(p.env["CODEX_HOME"], "/workspace/.git/forkyard/codex");
        let e = program(&req("claude-code", "sonet"), &m, 7).unwrap_err();
        assert!(e.to_string().starts_with("agent.model:"), "{e}");
        let e = program(&req("command", ""), &m, 7).unwrap_err();
        assert!(e.to_string().starts_with("agent.command:"), "{e}");
    }

    #[test]
    fn a_codex_branch_forks_its_parents_session() {
        let id = "01a22a25-89af-7900-ba9a-ee556fd09337";
        let mut r = req("codex", "gpt-5");
        r.branch_of = Some(forkyard_proto::agent::v1::BranchOf {
            parent_fork: 1,
            session: id.into(),
        });
        let p = program(&r, &Models::default(), 7).unwrap();
        assert!(
            p.script.contains("exec codex exec fork --json"),
            "{}",
            p.script
        );
        assert!(
            p.script
                .ends_with(&format!("=responses {id} \"$FORKYARD_PROMPT\"")),
            "{}",
            p.script
        );
    }

    #[test]
    fn allowed_models_default_to_the_spec_model() {
        let m = Models::default();
        let mut spec = AgentSpec::default();
        assert_eq!(allowed(&spec, "", &m), Allowed::Any);
        spec.model = "haiku".into();
        assert_eq!(
            allowed(&spec, "", &m),
            Allowed::Only(BTreeSet::from(["claude-haiku-4-5".to_owned()]))
        );
        spec.allowed_models = vec!["sonnet".into(), "gpt-5".into()];
        assert!(allowed(&spec, "claude-haiku-4-5", &m).permits("claude-sonnet-4-5"));
        assert!(!allowed(&spec, "claude-haiku-4-5", &m).permits("claude-haiku-4-5"));
    }
}
