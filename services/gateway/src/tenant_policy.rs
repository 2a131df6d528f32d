//! Per-tenant policy beyond the gate's call limits: what the API holds and the gate's
//! settings build.

// Traced: the tenant account calls join the LaunchRun trace.
use forkyard_common::grpc_telemetry::TracedChannel as Channel;
use forkyard_proto::budget::v1::budget_ledger_client::BudgetLedgerClient;

/// Per-tenant policy beyond the gate's call limits.
#[derive(Clone, Debug)]
pub struct TenantPolicy {
    /// Forks one tenant may have in flight over all its live runs.
    pub max_concurrent_forks: u32,
    /// The spending limit a tenant's ledger account starts with (micro-USD).
    pub default_budget_micros: i64,
    /// The ledger, for tenant accounts; `None` when authentication is off.
    pub ledger: Option<BudgetLedgerClient<Channel>>,
    /// Which repositories runs may name (local paths, the sandboxes' storage).
    pub repos: crate::repo_policy::RepoPolicy,
    /// Which hosts each tenant's runs may reach.
    pub egress: crate::egress_policy::EgressPolicy,
    /// Which backends each tenant's runs may use, the default, and what is offered.
    pub backends: crate::backend_policy::BackendPolicy,
}

impl Default for TenantPolicy {
    fn default() -> Self {
        Self {
            max_concurrent_forks: 1000,
            default_budget_micros: 100_000_000,
            ledger: None,
            repos: crate::repo_policy::RepoPolicy::default(),
            egress: crate::egress_policy::EgressPolicy::default(),
            backends: crate::backend_policy::BackendPolicy::default(),
        }
    }
}
