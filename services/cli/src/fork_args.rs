//! What `forkyard fork` takes.

use forkyard_proto::gateway::v1::BackendShare;

#[derive(Debug, clap::Args)]
#[command(after_help = "Examples:
  forkyard fork ./repo -p 'make the tests pass' -f 5 --max-concurrent 3 --budget 10 --verify 'cargo test' --wait
  forkyard fork https://github.com/org/repo -p @task.md --driver codex -m gpt-5 --egress crates,github
  forkyard fork ./repo -p 'try it' --agent-command './agent.sh' --label team=infra --request-id nightly-42
  forkyard fork ./repo -p 'fix it' -f 100 --max-concurrent 60 --backend local:40,e2b")]
pub struct ForkArgs {
    /// Git URL or local path of the repository.
    pub repo: String,
    /// The task every fork's agent is given; `@FILE` reads it from a file, `-` from
    /// standard input (`@@…` for a prompt that starts with `@`).
    #[arg(short, long)]
    pub prompt: String,
    /// How many forks (agents, each in its own sandbox).
    #[arg(short = 'f', long, default_value_t = 3)]
    pub forks: u32,
    /// Most forks running at once; the rest wait for a slot.
    #[arg(long, default_value_t = 3)]
    pub max_concurrent: u32,
    /// Total budget in US dollars, e.g. 10 or 2.50.
    #[arg(long, default_value = "10")]
    pub budget: String,
    /// What one fork may spend (USD); default: budget / forks.
    #[arg(long)]
    pub fork_budget: Option<String>,
    /// The agent: `claude-code` (the claude CLI), `codex` (the codex CLI), `command` (your
    /// --agent-command), or the runner's own loops `anthropic` / `openai`. Default:
    /// `command` with --agent-command, else `claude-code`.
    #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(forkyard_proto::Driver::ALL.map(forkyard_proto::Driver::name)))]
    pub driver: Option<String>,
    /// Shell command each fork runs in its sandbox (the `command` driver); the prompt is in
    /// $FORKYARD_PROMPT, and the LLM gateway in ANTHROPIC_BASE_URL / OPENAI_BASE_URL with
    /// the fork's token as ANTHROPIC_API_KEY / OPENAI_API_KEY.
    #[arg(long)]
    pub agent_command: Option<String>,
    /// Model id or alias (sonnet, opus, haiku, gpt-5, …) the agent uses.
    #[arg(short = 'm', long, default_value = "")]
    pub model: String,
    /// Most model turns per fork (claude-code and the runner's loops); 0: the runner's default.
    #[arg(long, default_value_t = 0)]
    pub max_turns: u32,
    /// Another model the fork's agent may ask for (repeatable); default: only --model.
    #[arg(long = "allow-model")]
    pub allowed_models: Vec<String>,
    /// What each fork's sandbox may reach besides the LLM gateway (repeatable or
    /// comma-separated): hosts, host:port, *.domain, or sets such as npm, pypi, crates,
    /// debian, github. Default: nothing.
    #[arg(long, value_delimiter = ',')]
    pub egress: Vec<String>,
    /// The image each fork's sandbox runs on (its toolchains): archive:<file> in the
    /// provisioners' image directory. Default: the provisioners' own /usr.
    #[arg(long, default_value = "")]
    pub image: String,
    /// What holds each fork's sandbox: bubblewrap (namespaces over the host's kernel)
    /// or gvisor (gVisor's user-space kernel, runsc, on the provisioners' hosts).
    /// Default: the provisioners' (bubblewrap).
    #[arg(long, default_value = "", value_parser = isolation)]
    pub isolation: String,
    /// Where each fork's sandbox runs: local (the provisioners' hosts) or e2b (E2B's
    /// cloud, where the provisioners hold an E2B key). Default: the operator's
    /// (FORKYARD_DEFAULT_BACKEND on the gateway, local unless set). Several, in order,
    /// each with its share (most forks in flight on it): `local:40,e2b` fills local up
    /// to 40 forks at once and sends the rest to e2b (the last entry's share may be left
    /// out: the rest), and a fork whose create a backend refuses moves to the next.
    #[arg(long, default_value = "", value_parser = backend)]
    pub backend: String,
    /// Keep the run open this many seconds after its last fork, for `forkyard branch`
    /// and `forkyard continue` (each fork's workspace is snapshotted at its end). 0: the
    /// run closes with its forks and cannot be branched.
    #[arg(long, default_value_t = 0)]
    pub branch_window: u32,
    /// Search over trajectories: this many rounds in all (the launch's forks are round
    /// 1). After each round the --keep best of it (by the run's ranking) are branched
    /// --branches times each into the next, from their end (workspace and conversation),
    /// with --follow-up as the next turn.
    #[arg(long, default_value_t = 0)]
    pub rounds: u32,
    /// With --rounds: forks kept after each round.
    #[arg(long, default_value_t = 1, requires = "rounds")]
    pub keep: u32,
    /// With --rounds: branches of each kept fork.
    #[arg(long, default_value_t = 2, requires = "rounds")]
    pub branches: u32,
    /// With --rounds: the next user turn of each branch, a template naming {prompt},
    /// {fork}, {round}, {verify_exit_code} and {verify_output} (the kept fork's verify
    /// output's end, e.g. the failing tests). Default: the run's prompt again.
    #[arg(long, default_value = "", requires = "rounds")]
    pub follow_up: String,
    /// Branch prefix: fork n works on <branch>-fork-<n>.
    #[arg(short, long, default_value = "forkyard")]
    pub branch: String,
    /// Per-fork agent timeout in seconds.
    #[arg(short, long, default_value_t = 600)]
    pub timeout: u32,
    /// Command run in each fork's sandbox after its agent; exit 0 means verified.
    #[arg(long)]
    pub verify: Option<String>,
    /// Stop the other forks as soon as one verifies.
    #[arg(long, requires = "verify")]
    pub stop_on_first_verified: bool,
    /// Push forks as branches of the repository's remote when the run ends (with the
    /// git credentials the operator gave the mesh): the winner, every succeeded fork, or
    /// every verified one. Branches are <branch>-fork-<n>, never forced over.
    #[arg(long, value_enum)]
    pub push: Option<PushMode>,
    /// Open a pull (merge) request for the winner; `--pr each`: for every pushed fork.
    #[arg(long, requires = "push", num_args = 0..=1, default_missing_value = "winner", value_enum)]
    pub pr: Option<PrMode>,
    /// Open pull requests as drafts.
    #[arg(long, requires = "pr")]
    pub draft: bool,
    /// Author (and committer) of the pushed commits: "Name <email>".
    #[arg(long, requires = "push", value_parser = parse_author)]
    pub author: Option<(String, String)>,
    /// Idempotency key: launching again with the same id returns the same run.
    #[arg(long, default_value = "")]
    pub request_id: String,
    /// Label the run (repeatable): key=value.
    #[arg(long = "label", value_parser = parse_label)]
    pub labels: Vec<(String, String)>,
    /// Wait for the run to finish, showing progress, and print its forks.
    #[arg(long, overrides_with = "no_wait")]
    pub wait: bool,
    /// Print the run id and return at once (the default).
    #[arg(long, overrides_with = "wait")]
    pub no_wait: bool,
}

/// Which forks `--push` delivers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PushMode {
    Winner,
    Succeeded,
    Verified,
}

/// Which pushed forks get a pull request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PrMode {
    Winner,
    Each,
}

pub(crate) fn parse_author(s: &str) -> Result<(String, String), String> {
    let (name, rest) = s
        .split_once('<')
        .ok_or_else(|| format!("{s:?} is not \"Name <email>\""))?;
    let email = rest
        .strip_suffix('>')
        .ok_or_else(|| format!("{s:?} is not \"Name <email>\""))?;
    Ok((name.trim().to_owned(), email.trim().to_owned()))
}

pub(crate) fn parse_label(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .filter(|(k, _)| !k.is_empty())
        .ok_or_else(|| format!("{s:?} is not key=value"))
}

/// `--isolation`: empty or one of the levels a sandbox can have.
fn isolation(s: &str) -> Result<String, String> {
    let name = s.trim();
    if name.is_empty() || forkyard_proto::ISOLATIONS.contains(&name) {
        Ok(name.to_owned())
    } else {
        Err(format!("one of: {}", forkyard_proto::ISOLATIONS.join(", ")))
    }
}

/// `--backend`: empty, one of the backends a sandbox can run on, or a list of them
/// with shares (`local:40,e2b`): `forkyard_proto::backends`.
fn backend(s: &str) -> Result<String, String> {
    forkyard_proto::backends::parse(s).map(|_| s.trim().to_owned())
}

/// What `--backend` (checked by [`backend`]) asks of LaunchRun.
pub(crate) fn backends_of(flag: &str) -> (String, Vec<BackendShare>) {
    forkyard_proto::backends::parse(flag).unwrap_or_default()
}
