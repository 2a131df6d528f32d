//! The command line: what each subcommand takes.

pub use crate::fork_args::ForkArgs;
use crate::fork_args::{parse_author, parse_label};
use crate::{config::Flags, output::Output};
use clap::{Parser, Subcommand};
use clap_complete::engine::ArgValueCompleter;

#[derive(Debug, Parser)]
#[command(
    name = "forkyard",
    version,
    about = "Run one prompt on one repo as N parallel agent forks",
    after_help = "Examples:
  forkyard fork ./repo -p @task.md -f 5 --max-concurrent 3 --budget 10 --verify 'cargo test' --wait
  forkyard list --state running
  forkyard watch run-3f2a…
  forkyard result run-3f2a… --winner --save winner.patch
  forkyard apply run-3f2a…
  forkyard status run-3f2a… --jq '.forks[] | select(.status == \"FORK_STATUS_SUCCEEDED\") | .fork'
  forkyard config set-context prod --gateway https://forkyard.example:443 --api-key-command 'pass forkyard'
  forkyard completion bash > /etc/bash_completion.d/forkyard

Each setting is taken from its flag, else its environment variable, else the context
(~/.config/forkyard/config.toml, `forkyard config`), else its default: the gateway
FORKYARD_GATEWAY (http://127.0.0.1:50051), its key FORKYARD_API_KEY, its CA
FORKYARD_GATEWAY_CA, the output FORKYARD_OUTPUT (table)."
)]
pub struct Cli {
    /// Gateway gRPC endpoint (`https://` for TLS); default: the context's, else
    /// http://127.0.0.1:50051.
    #[arg(long, global = true, env = "FORKYARD_GATEWAY")]
    pub gateway: Option<String>,
    /// API key for the gateway (`forkyard keys create` makes one); sent as a bearer token.
    #[arg(long, global = true, env = "FORKYARD_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// PEM CA to verify a TLS gateway (`https://` endpoints) with; default: the context's,
    /// else the system roots.
    #[arg(long, visible_alias = "ca", global = true, env = "FORKYARD_GATEWAY_CA")]
    pub gateway_ca: Option<std::path::PathBuf>,
    /// The context to use (`forkyard config get-contexts`); default: the current one.
    #[arg(long, global = true, env = "FORKYARD_CONTEXT", add = ArgValueCompleter::new(crate::complete::context_names))]
    pub context: Option<String>,
    /// Output of read commands: a table for people; JSON (the standard protobuf mapping,
    /// as grpcurl prints) or YAML (as kubectl prints) for scripts. Default: the
    /// context's, else table.
    #[arg(long, short = 'o', global = true, value_enum, env = "FORKYARD_OUTPUT")]
    pub output: Option<Output>,
    /// Filter the JSON output with a jq expression, as gh's --jq: one result a line,
    /// strings printed raw.
    #[arg(long, short = 'q', global = true, value_name = "EXPR", value_parser = crate::jq::check)]
    pub jq: Option<String>,
    #[command(subcommand)]
    pub command: Command,
}

impl Cli {
    /// The settings its flags (and their environment variables) give.
    pub fn flags(&self) -> Flags {
        Flags {
            gateway: self.gateway.clone(),
            api_key: self.api_key.clone(),
            gateway_ca: self.gateway_ca.clone(),
            output: self.output,
            jq: self.jq.is_some(),
        }
    }
}

/// A run id argument, completed from the gateway's runs.
fn run_ids() -> ArgValueCompleter {
    ArgValueCompleter::new(crate::complete::run_ids)
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Launch a run: the prompt on the repo, as N forks.
    Fork(Box<ForkArgs>),
    /// Show a run and its forks.
    Status {
        /// The run (as `fork` printed it, or `list` shows).
        #[arg(add = run_ids())]
        run_id: String,
    },
    /// Follow a run live until it finishes.
    Watch {
        /// The run to follow.
        #[arg(add = run_ids())]
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
        /// Only this tenant's runs. An admin tenant (the gateway's --admin-tenants) lists
        /// every tenant's runs without it; anyone else lists only its own.
        #[arg(long)]
        tenant: Option<String>,
    },
    /// Cancel a run: its forks stop and their sandboxes are destroyed.
    Cancel {
        /// The run to cancel.
        #[arg(add = run_ids())]
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
        #[arg(add = run_ids())]
        run_id: String,
    },
    /// Resume a paused run.
    Resume {
        /// The run to resume.
        #[arg(add = run_ids())]
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
        #[arg(add = run_ids())]
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
    /// Branch a fork into N new forks of its run, each starting from the fork's workspace
    /// and agent session: at its end, or, for a running fork, at its last completed model
    /// turn (it goes on). -p is the next instruction (empty: the run's prompt again). The
    /// run must be open for branches (fork --branch-window).
    Branch {
        /// The fork's run.
        #[arg(add = run_ids())]
        run_id: String,
        /// The fork to branch (finished: succeeded, failed, timed out, out of budget; or
        /// running: taken at its next model request, waited for within the gateway's call
        /// deadline, 20 s by default).
        fork: u32,
        /// How many branches.
        #[arg(short = 'n', long = "count", default_value_t = 1)]
        count: u32,
        /// The branches' next instruction; default: the run's prompt again.
        #[arg(short, long, default_value = "")]
        prompt: String,
        /// Wait for the branches to finish and print the run.
        #[arg(long)]
        wait: bool,
    },
    /// Continue a finished fork with a follow-up instruction ("now add tests"): a
    /// branch of one.
    Continue {
        /// The fork's run.
        #[arg(add = run_ids())]
        run_id: String,
        /// The fork to continue.
        fork: u32,
        /// The follow-up instruction.
        #[arg(short, long)]
        prompt: String,
        /// Wait for it to finish and print the run.
        #[arg(long)]
        wait: bool,
    },
    /// One fork in full: its patch (printed, or saved with --save), output, verification.
    #[command(group = clap::ArgGroup::new("which").args(["fork", "winner"]).required(true))]
    Result {
        /// The fork's run.
        #[arg(add = run_ids())]
        run_id: String,
        /// The fork's number (1 to the run's forks).
        fork: Option<u32>,
        /// The run's winner (its best fork: verified first, then cheaper, then smaller).
        #[arg(long)]
        winner: bool,
        /// Write the patch to this file instead of printing the fork.
        #[arg(long)]
        save: Option<std::path::PathBuf>,
    },
    /// Apply a fork's patch (default: the run's winner) to the git checkout here, to its
    /// files and its index, as `git apply --index`. Refused on a checkout with changes
    /// (unless --force) and for a patch the run cut short.
    Apply {
        /// The fork's run.
        #[arg(add = run_ids())]
        run_id: String,
        /// The fork's number; default: the run's winner.
        fork: Option<u32>,
        /// Apply on a checkout with uncommitted changes too (a file both changed here and
        /// by the patch still stops it).
        #[arg(long)]
        force: bool,
    },
    /// Schedule the janitor's sweep (creates or updates the schedule, resuming it when
    /// stopped; each gateway creates one at start when there is none).
    Cleanup {
        /// Minutes between sweeps.
        #[arg(long, default_value_t = 15)]
        interval: u32,
        /// Destroy sandboxes older than this many minutes, whatever their owner.
        #[arg(long, default_value_t = 180)]
        max_age: u32,
    },
    /// Stop the janitor's schedule (paused, so no gateway start makes it anew;
    /// `forkyard cleanup` resumes it).
    StopCleanup,
    /// API keys of the gateway (works on its key file, so run it where the gateway runs).
    Keys(KeysArgs),
    /// Contexts: named gateways with their CA, key and output, in
    /// ~/.config/forkyard/config.toml ($XDG_CONFIG_HOME, or FORKYARD_CONFIG), as kubectl's.
    Config {
        #[command(subcommand)]
        command: ConfigCommand,
    },
    /// Print a shell completion script (run ids completed from the gateway):
    /// `forkyard completion bash > /etc/bash_completion.d/forkyard`, or
    /// `source <(COMPLETE=bash forkyard)`.
    Completion {
        /// The shell to complete in.
        shell: clap_complete::Shell,
    },
}

#[derive(Debug, Subcommand)]
pub enum ConfigCommand {
    /// Every context; `*` marks the current one. Keys are never shown, only whether set.
    GetContexts,
    /// The current context's name.
    CurrentContext,
    /// Make NAME the current context.
    UseContext {
        /// The context.
        #[arg(add = ArgValueCompleter::new(crate::complete::context_names))]
        name: String,
    },
    /// Create or change a context: --gateway, --ca (--gateway-ca), --api-key and
    /// --api-key-command as given; what is not given stays.
    SetContext(SetContextArgs),
    /// Remove a context.
    DeleteContext {
        /// The context.
        #[arg(add = ArgValueCompleter::new(crate::complete::context_names))]
        name: String,
    },
}

#[derive(Debug, clap::Args)]
#[command(after_help = "Examples:
  forkyard config set-context local --gateway http://127.0.0.1:50051
  forkyard config set-context prod --gateway https://forkyard.example:443 --ca ca.pem --api-key-command 'pass show forkyard/prod'
  forkyard config use-context prod")]
pub struct SetContextArgs {
    /// The context.
    #[arg(add = ArgValueCompleter::new(crate::complete::context_names))]
    pub name: String,
    /// A command whose output is the API key (a password manager, a secret store); run
    /// by `sh -c` each time the key is needed. Replaces a stored --api-key.
    #[arg(long, conflicts_with = "api_key")]
    pub api_key_command: Option<String>,
    /// The output this context defaults to.
    #[arg(long, value_enum)]
    pub default_output: Option<Output>,
    /// Make it the current context too.
    #[arg(long)]
    pub current: bool,
}

#[derive(Debug, clap::Args)]
pub struct KeysArgs {
    /// Manage the key store directly, not through the gateway's API: how the first
    /// admin key is made, on the gateway's host. Also when `--keys-db` or `--keys-url`
    /// is given, or no API key is configured.
    #[arg(long)]
    pub local: bool,
    /// The gateway's API key file (local); default `<state dir>/gateway/api-keys.db`.
    #[arg(long, env = "FORKYARD_API_KEYS_DB", conflicts_with = "keys_url")]
    pub keys_db: Option<std::path::PathBuf>,
    /// The key store's URL (local): `postgres://…` or `sqlite://<file>`.
    #[arg(long, env = "FORKYARD_API_KEYS_URL", hide_env_values = true)]
    pub keys_url: Option<String>,
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
        #[arg(add = run_ids())]
        run_id: String,
        /// US dollars to add, e.g. 5 or 2.50.
        amount: String,
    },
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
