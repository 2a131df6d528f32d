//! The command line: what each subcommand takes.

use clap::{Parser, Subcommand, ValueEnum};

#[derive(Debug, Parser)]
#[command(
    name = "forkyard",
    version,
    about = "Run one prompt on one repo as N parallel agent forks"
)]
pub struct Cli {
    /// Gateway gRPC endpoint.
    #[arg(
        long,
        global = true,
        env = "FORKYARD_GATEWAY",
        default_value = "http://127.0.0.1:50051"
    )]
    pub gateway: String,
    /// API key for the gateway (`forkyard keys create` makes one); sent as a bearer token.
    #[arg(long, global = true, env = "FORKYARD_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// PEM CA to verify a TLS gateway (`https://` endpoints) with; default: system roots.
    #[arg(long, global = true, env = "FORKYARD_GATEWAY_CA")]
    pub gateway_ca: Option<std::path::PathBuf>,
    /// Output of read commands: a table for people, JSON for scripts.
    #[arg(long, short = 'o', global = true, value_enum, default_value_t = Output::Table)]
    pub output: Output,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    Table,
    Json,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Launch a run: the prompt on the repo, as N forks.
    Fork(Box<ForkArgs>),
    /// Show a run and its forks.
    Status { run_id: String },
    /// Follow a run live until it finishes.
    Watch { run_id: String },
    /// List runs, newest first.
    List {
        #[arg(long, default_value_t = 20)]
        limit: u32,
        /// Only runs in this state (running, paused, awaiting-budget, completed, failed, cancelled, ...).
        #[arg(long)]
        state: Option<String>,
        /// Only runs with this label (repeatable): key=value.
        #[arg(long = "label", value_parser = parse_label)]
        labels: Vec<(String, String)>,
    },
    /// Cancel a run: its forks stop and their sandboxes are destroyed.
    Cancel {
        run_id: String,
        /// Cancel only this fork.
        #[arg(long)]
        fork: Option<u32>,
        #[arg(long, default_value = "")]
        reason: String,
    },
    /// Pause a run: no new fork starts; running forks go on.
    Pause { run_id: String },
    /// Resume a paused run.
    Resume { run_id: String },
    /// The run's budget.
    Budget {
        #[command(subcommand)]
        command: BudgetCommand,
    },
    /// One fork in full: its patch (printed, or saved with --save), output, verification.
    Result {
        run_id: String,
        fork: u32,
        /// Write the patch to this file instead of printing the fork.
        #[arg(long)]
        save: Option<std::path::PathBuf>,
    },
    /// Schedule the janitor's sweep (creates or updates the schedule).
    Cleanup {
        /// Minutes between sweeps.
        #[arg(long, default_value_t = 15)]
        interval: u32,
        /// Destroy sandboxes older than this many minutes, whatever their owner.
        #[arg(long, default_value_t = 180)]
        max_age: u32,
    },
    /// Remove the janitor's schedule.
    StopCleanup,
    /// API keys of the gateway (works on its key file, so run it where the gateway runs).
    Keys(KeysArgs),
}

#[derive(Debug, clap::Args)]
pub struct KeysArgs {
    /// The gateway's API key file; default `<state dir>/gateway/api-keys.db`.
    #[arg(long, env = "FORKYARD_API_KEYS_DB")]
    pub keys_db: Option<std::path::PathBuf>,
    /// The gateway's state directory.
    #[arg(long, env = "FORKYARD_STATE_DIR", default_value = ".forkyard")]
    pub state_dir: std::path::PathBuf,
    #[command(subcommand)]
    pub command: KeysCommand,
}

#[derive(Debug, Subcommand)]
pub enum KeysCommand {
    /// Make a key for a tenant; the key is printed once and stored only as a digest.
    Create {
        #[arg(long)]
        tenant: String,
        /// What the key is for (shown by `keys list`).
        #[arg(long, default_value = "")]
        name: String,
    },
    /// Every key: id, tenant, name, created, revoked.
    List,
    /// Revoke a key by id; the gateway refuses it from the next call on.
    Revoke { id: String },
}

#[derive(Debug, Subcommand)]
pub enum BudgetCommand {
    /// Add to a run's budget (USD); a run awaiting budget goes on.
    Raise { run_id: String, amount: String },
}

#[derive(Debug, clap::Args)]
pub struct ForkArgs {
    /// Git URL or local path of the repository.
    pub repo: String,
    #[arg(short, long)]
    pub prompt: String,
    #[arg(short = 'f', long, default_value_t = 3)]
    pub forks: u32,
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
    #[arg(long, value_parser = ["command", "claude-code", "codex", "anthropic", "openai"])]
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

fn parse_label(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .filter(|(k, _)| !k.is_empty())
        .ok_or_else(|| format!("{s:?} is not key=value"))
}
