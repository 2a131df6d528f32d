//! The command line: what each subcommand takes.

use clap::{Parser, Subcommand, ValueEnum};

#[derive(Debug, Parser)]
#[command(
    name = "forkyard",
    version,
    about = "Run one prompt on one repo as N parallel agent forks",
    after_help = "Examples:
  forkyard fork ./repo -p 'fix the flaky test' -f 5 --max-concurrent 3 --budget 10 --verify 'cargo test' --wait
  forkyard list --state running
  forkyard watch run-3f2a…
  forkyard result run-3f2a… 2 --save fork-2.patch
  forkyard -o json status run-3f2a… | jq .forks
  forkyard completion bash > /etc/bash_completion.d/forkyard

The gateway is FORKYARD_GATEWAY (default http://127.0.0.1:50051), its key FORKYARD_API_KEY."
)]
pub struct Cli {
    /// Gateway gRPC endpoint (`https://` for TLS).
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
    /// Output of read commands: a table for people; JSON (the standard protobuf mapping,
    /// as grpcurl prints) or YAML for scripts.
    #[arg(long, short = 'o', global = true, value_enum, default_value_t = Output::Table)]
    pub output: Output,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    Table,
    Json,
    Yaml,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Launch a run: the prompt on the repo, as N forks.
    Fork(Box<ForkArgs>),
    /// Show a run and its forks.
    Status {
        /// The run (as `fork` printed it, or `list` shows).
        run_id: String,
    },
    /// Follow a run live until it finishes.
    Watch {
        /// The run to follow.
        run_id: String,
    },
    /// List runs, newest first.
    List {
        /// Most runs to show.
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
        /// The run to cancel.
        run_id: String,
        /// Cancel only this fork.
        #[arg(long)]
        fork: Option<u32>,
        /// Why, recorded with the cancellation.
        #[arg(long, default_value = "")]
        reason: String,
    },
    /// Pause a run: no new fork starts; running forks go on.
    Pause {
        /// The run to pause.
        run_id: String,
    },
    /// Resume a paused run.
    Resume {
        /// The run to resume.
        run_id: String,
    },
    /// The run's budget.
    Budget {
        #[command(subcommand)]
        command: BudgetCommand,
    },
    /// Deliver one fork of a finished run: push its branch (<branch>-fork-<n>) to the
    /// run's repository and, with --pr, open a pull request. Once per fork: asked again,
    /// it prints what the first time did.
    Publish {
        /// The fork's run.
        run_id: String,
        /// The fork (one that succeeded).
        fork: u32,
        /// Open a pull (merge) request for it.
        #[arg(long)]
        pr: bool,
        /// Open it as a draft.
        #[arg(long, requires = "pr")]
        draft: bool,
        /// Branch prefix (default: the run's branch).
        #[arg(long, default_value = "")]
        branch: String,
        /// Author (and committer) of the commit: "Name <email>".
        #[arg(long, value_parser = parse_author)]
        author: Option<(String, String)>,
    },
    /// One fork in full: its patch (printed, or saved with --save), output, verification.
    Result {
        /// The fork's run.
        run_id: String,
        /// The fork's number (1 to the run's forks).
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
    /// Print a shell completion script: `forkyard completion bash > /etc/bash_completion.d/forkyard`.
    Completion {
        /// The shell to complete in.
        shell: clap_complete::Shell,
    },
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
        /// The tenant the key acts for (`[a-z0-9-]`): its runs, its limits.
        #[arg(long)]
        tenant: String,
        /// What the key is for (shown by `keys list`).
        #[arg(long, default_value = "")]
        name: String,
    },
    /// Every key: id, tenant, name, created, revoked.
    List,
    /// Revoke a key by id; the gateway refuses it from the next call on.
    Revoke {
        /// The key's id (`keys list`), not the key itself.
        id: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum BudgetCommand {
    /// Add to a run's budget (USD); a run awaiting budget goes on.
    Raise {
        /// The run whose budget to raise.
        run_id: String,
        /// US dollars to add, e.g. 5 or 2.50.
        amount: String,
    },
}

#[derive(Debug, clap::Args)]
#[command(after_help = "Examples:
  forkyard fork ./repo -p 'make the tests pass' -f 5 --max-concurrent 3 --budget 10 --verify 'cargo test' --wait
  forkyard fork https://github.com/org/repo -p \"$(cat task.md)\" --driver codex -m gpt-5 --egress crates,github
  forkyard fork ./repo -p 'try it' --agent-command './agent.sh' --label team=infra --request-id nightly-42")]
pub struct ForkArgs {
    /// Git URL or local path of the repository.
    pub repo: String,
    /// The task every fork's agent is given.
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

fn parse_author(s: &str) -> Result<(String, String), String> {
    let (name, rest) = s
        .split_once('<')
        .ok_or_else(|| format!("{s:?} is not \"Name <email>\""))?;
    let email = rest
        .strip_suffix('>')
        .ok_or_else(|| format!("{s:?} is not \"Name <email>\""))?;
    Ok((name.trim().to_owned(), email.trim().to_owned()))
}

fn parse_label(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .filter(|(k, _)| !k.is_empty())
        .ok_or_else(|| format!("{s:?} is not key=value"))
}

#[cfg(test)]
mod tests {
    use super::Cli;
    use clap::CommandFactory;

    /// Every flag and argument of every subcommand says what it is in `--help`.
    #[test]
    fn every_argument_has_help_text() {
        fn walk(cmd: &clap::Command, path: &str, missing: &mut Vec<String>) {
            for arg in cmd.get_arguments() {
                let id = arg.get_id().as_str();
                if matches!(id, "help" | "version") {
                    continue;
                }
                if arg.get_help().is_none() && arg.get_long_help().is_none() {
                    missing.push(format!("{path} {id}"));
                }
            }
            for sub in cmd.get_subcommands() {
                if sub.get_about().is_none() {
                    missing.push(format!("{path} {} (the command)", sub.get_name()));
                }
                walk(sub, &format!("{path} {}", sub.get_name()), missing);
            }
        }
        let mut missing = Vec::new();
        walk(&Cli::command(), "forkyard", &mut missing);
        assert!(missing.is_empty(), "no help text: {missing:#?}");
    }

    #[test]
    fn the_command_line_is_consistent_and_shows_examples() {
        Cli::command().debug_assert();
        let mut cmd = Cli::command();
        let help = cmd.render_long_help().to_string();
        assert!(help.contains("Examples:"), "{help}");
        let fork = cmd
            .find_subcommand_mut("fork")
            .unwrap()
            .render_long_help()
            .to_string();
        assert!(fork.contains("Examples:"), "{fork}");
    }
}
