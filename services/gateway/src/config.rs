//! The gateway's settings: its flags (each with its environment variable), their
//! checks, and the clients and limits made from them.

use crate::{
    activities::{ledger::LedgerLocal, sandboxes::SandboxLocal},
    api::{AgentRunnerLink, GatewayService, ReadLimits},
    auth::config::SecurityArgs,
    validate::{Limits, MAX_INLINE_FORK_LIMIT},
};
use clap::Parser;
use forkyard_common::{StateDirArg, TemporalArgs, tls::TlsArgs};

#[derive(Debug, Parser)]
#[command(
    name = "gateway",
    version,
    about = "Forkyard gateway: the public run API and the workflow worker"
)]
pub struct Args {
    /// Address the gRPC API listens on.
    #[arg(long, env = "FORKYARD_LISTEN", default_value = "127.0.0.1:50051")]
    pub listen: String,
    /// Largest number of forks one run may ask for (at most 1300: the run's history).
    #[arg(long, env = "FORKYARD_MAX_FORKS", default_value_t = 1000)]
    pub max_forks: u32,
    /// Runs of up to this many forks run their forks' steps in the run's own workflow
    /// (fewer Temporal operations per fork); larger runs give each fork a child workflow
    /// of its own, which keeps the run's history small. 0: always child workflows. At
    /// most 300: the run's history holds its inline forks' agent events and patches.
    #[arg(long, env = "FORKYARD_INLINE_FORK_LIMIT", default_value_t = crate::validate::DEFAULT_INLINE_FORK_LIMIT)]
    pub inline_fork_limit: u32,
    /// budget-ledger's gRPC endpoint; the run workflows' ledger calls go there as local
    /// activities of this worker.
    #[arg(
        long,
        env = "FORKYARD_LEDGER_ADDR",
        default_value = "http://127.0.0.1:50054"
    )]
    pub ledger_addr: String,
    /// sandbox-provisioner's gRPC endpoint (several separated by commas are balanced):
    /// the fork workflows' sandbox control calls go there as local activities of this
    /// worker; calls about an existing sandbox go to its owner replica.
    #[arg(
        long,
        env = "FORKYARD_PROVISIONER_ADDR",
        default_value = "http://127.0.0.1:50052"
    )]
    pub provisioner_addr: String,
    /// Concurrent workflow-task polls (sticky and normal queues together). Unset: the
    /// SDK's default (5, or poller autoscaling where the server offers it).
    #[arg(long, env = "FORKYARD_WORKFLOW_TASK_POLLERS")]
    pub workflow_task_pollers: Option<usize>,
    /// Seconds a run's next workflow task waits for the gateway that last ran it (its
    /// cached state, no replay) before any gateway takes it with a replay. After a
    /// gateway crash this is how long its runs stand still; shorter means more replays
    /// when a live gateway is merely slow. Temporal's SDK default.
    #[arg(long, env = "FORKYARD_STICKY_TIMEOUT_SECS", default_value_t = 10)]
    pub sticky_timeout_secs: u64,
    /// Add the search attributes runs need when the namespace lacks them (the operator
    /// API). `false` where that is not allowed (Temporal Cloud): the gateway then waits,
    /// NOT_SERVING, for them to be created, naming them and the command.
    #[arg(
        long,
        env = "FORKYARD_REGISTER_SEARCH_ATTRIBUTES",
        default_value_t = true,
        action = clap::ArgAction::Set
    )]
    pub register_search_attributes: bool,
    /// Minutes between the janitor's sweeps on the schedule each gateway creates at start
    /// when there is none (an existing one, paused by `forkyard stop-cleanup` or changed
    /// by `forkyard cleanup`, is left as it is); 0: no schedule unless asked for.
    #[arg(long, env = "FORKYARD_CLEANUP_INTERVAL_MINUTES", default_value_t = 15)]
    pub cleanup_interval_minutes: u32,
    /// On that schedule, sandboxes older than this are destroyed whatever their owner.
    #[arg(long, env = "FORKYARD_CLEANUP_MAX_AGE_MINUTES", default_value_t = 180)]
    pub cleanup_max_age_minutes: u32,
    /// The agent runner asked at launch whether it can run an LLM agent spec (model
    /// alias, API key) and for fork transcripts.
    #[arg(
        long,
        env = "FORKYARD_AGENT_RUNNER_ADDR",
        default_value = "http://127.0.0.1:50053"
    )]
    pub agent_runner_addr: String,
    /// How long this replica serves a running run's view (GetRun, WatchRun) before it
    /// asks Temporal again; a write through this replica refreshes it at once. Closed
    /// runs are kept without asking again.
    #[arg(long, env = "FORKYARD_RUN_VIEW_TTL_MS", default_value_t = 500)]
    pub run_view_ttl_ms: u64,
    /// Most run views fetched from Temporal at once; a read that cannot start its fetch
    /// within 2 s is refused with UNAVAILABLE rather than queued.
    #[arg(long, env = "FORKYARD_RUN_VIEW_FETCHES", default_value_t = 32)]
    pub run_view_fetches: usize,
    #[command(flatten)]
    pub temporal: TemporalArgs,
    #[command(flatten)]
    pub metrics: forkyard_common::metrics::MetricsArgs,
    #[command(flatten)]
    pub security: SecurityArgs,
    #[command(flatten)]
    pub tls: TlsArgs,
    #[command(flatten)]
    pub discovery: forkyard_common::discovery::DiscoveryArgs,
    #[command(flatten)]
    pub state: StateDirArg,
}

/// The services the gateway calls, each a lazy client of its address setting.
pub struct Links {
    pub ledger: LedgerLocal,
    pub sandboxes: SandboxLocal,
    pub agent_runner: AgentRunnerLink,
}

impl Args {
    /// The clients of the ledger, the provisioners and the agent runner; the error
    /// names the address setting that is wrong.
    pub fn links(&self) -> Result<Links, String> {
        Ok(Links {
            ledger: LedgerLocal::new(&self.ledger_addr)?,
            sandboxes: SandboxLocal::new(&self.provisioner_addr)?,
            agent_runner: AgentRunnerLink::new(&self.agent_runner_addr)?,
        })
    }

    /// The settings out of range, and the tenants' repository and egress policies; the
    /// error names the setting.
    pub fn check(&self) -> Result<(), String> {
        if self.run_view_fetches == 0 {
            return Err(
                "--run-view-fetches (FORKYARD_RUN_VIEW_FETCHES) must be at least 1".to_owned(),
            );
        }
        use crate::api::cleanup::{MAX_AGE_MINUTES, MAX_INTERVAL_MINUTES};
        if self.cleanup_interval_minutes > MAX_INTERVAL_MINUTES {
            return Err(format!(
                "--cleanup-interval-minutes (FORKYARD_CLEANUP_INTERVAL_MINUTES) must be 0..={MAX_INTERVAL_MINUTES}"
            ));
        }
        if !(1..=MAX_AGE_MINUTES).contains(&self.cleanup_max_age_minutes) {
            return Err(format!(
                "--cleanup-max-age-minutes (FORKYARD_CLEANUP_MAX_AGE_MINUTES) must be 1..={MAX_AGE_MINUTES}"
            ));
        }
        if !(1..=600).contains(&self.sticky_timeout_secs) {
            return Err(
                "--sticky-timeout-secs (FORKYARD_STICKY_TIMEOUT_SECS) must be 1..=600".to_owned(),
            );
        }
        if self.workflow_task_pollers.is_some_and(|n| n < 2) {
            return Err(
                "--workflow-task-pollers (FORKYARD_WORKFLOW_TASK_POLLERS) must be at least 2"
                    .to_owned(),
            );
        }
        if self.max_forks == 0 {
            return Err("--max-forks (FORKYARD_MAX_FORKS) must be at least 1".to_owned());
        }
        // About 5 events of the run's own history per fork, more for forks that wait for
        // budget or are retried (see workflows::orchestration): room for those.
        if self.max_forks > 1300 {
            return Err(
                "--max-forks (FORKYARD_MAX_FORKS) must be at most 1300: a larger run's history could come near Temporal's 10,240-event warning".to_owned(),
            );
        }
        if self.inline_fork_limit > MAX_INLINE_FORK_LIMIT {
            return Err(format!(
                "--inline-fork-limit (FORKYARD_INLINE_FORK_LIMIT) must be at most {MAX_INLINE_FORK_LIMIT}, the most forks a run may have"
            ));
        }
        self.security.check_policies(&self.state.state_dir)
    }

    /// The public API on `client`, with these settings' limits and the tenants' policy.
    pub fn api(
        &self,
        client: temporalio_client::Client,
        agent_runner: AgentRunnerLink,
        tenancy: crate::api::TenantPolicy,
    ) -> GatewayService {
        GatewayService::new(
            client,
            Limits {
                max_forks: self.max_forks,
                inline_fork_limit: self.inline_fork_limit,
            },
        )
        .with_agent_runner(agent_runner)
        .with_tenancy(tenancy)
        .with_deadline(self.security.deadline())
        .with_read_limits(ReadLimits {
            live_ttl: std::time::Duration::from_millis(self.run_view_ttl_ms),
            max_fetches: self.run_view_fetches,
            ..ReadLimits::default()
        })
    }
}
