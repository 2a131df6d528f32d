//! Activity contracts shared by the workflows (gateway) and the services that implement
//! them. Bodies are never called: the macro only records name, input and output.
#![allow(clippy::unused_async)]

use crate::{
    agent::v1::{RunAgentRequest, RunAgentResponse},
    budget::v1::{
        Account, ChargeRequest, CommitRequest, CreateAccountRequest, GetAccountRequest,
        GetSpendReportRequest, ListPostingsRequest, ListPostingsResponse, OpenAccountRequest,
        RaiseBudgetRequest, ReleaseRequest, Reservation, ReserveRequest, SpendReport,
    },
    janitor::v1::{SweepReport, SweepRequest},
    sandbox::v1::{
        CollectPatchRequest, CollectPatchResponse, CreateSandboxRequest, DestroySandboxRequest,
        DestroySandboxResponse, ExecRequest, ExecResponse, ForkSandboxRequest, ForkSandboxResponse,
        GetSandboxRequest, HealthCheckRequest, HealthCheckResponse, HydrateWorkspaceRequest,
        ListSandboxesRequest, ListSandboxesResponse, PersistWorkspaceRequest,
        PersistWorkspaceResponse, ReadFileRequest, ReadFileResponse, Sandbox, StartSandboxRequest,
        StopSandboxRequest, WriteFileRequest, WriteFileResponse,
    },
};
use temporalio_macros::activity_definitions;
use temporalio_sdk::activities::ActivityError;

/// Sandbox lifecycle on the `local` (bubblewrap) backend, queue `sandbox-provisioner`.
/// Names carry the backend prefix so a run can choose its backend.
pub struct LocalSandbox;

#[activity_definitions]
impl LocalSandbox {
    #[activity(name = "local.create")]
    pub fn create(_req: CreateSandboxRequest) -> Result<Sandbox, ActivityError> {
        unimplemented!()
    }

    #[activity(name = "local.health")]
    pub fn health(_req: HealthCheckRequest) -> Result<HealthCheckResponse, ActivityError> {
        unimplemented!()
    }

    /// A command in the sandbox (e.g. a fork's verify command).
    #[activity(name = "local.exec")]
    pub fn exec(_req: ExecRequest) -> Result<ExecResponse, ActivityError> {
        unimplemented!()
    }

    #[activity(name = "local.collect_patch")]
    pub fn collect_patch(_req: CollectPatchRequest) -> Result<CollectPatchResponse, ActivityError> {
        unimplemented!()
    }

    #[activity(name = "local.destroy")]
    pub fn destroy(_req: DestroySandboxRequest) -> Result<DestroySandboxResponse, ActivityError> {
        unimplemented!()
    }

    #[activity(name = "local.get")]
    pub fn get(_req: GetSandboxRequest) -> Result<Sandbox, ActivityError> {
        unimplemented!()
    }

    #[activity(name = "local.list")]
    pub fn list(_req: ListSandboxesRequest) -> Result<ListSandboxesResponse, ActivityError> {
        unimplemented!()
    }

    /// Small files only: the content travels in the Temporal payload.
    #[activity(name = "local.read_file")]
    pub fn read_file(_req: ReadFileRequest) -> Result<ReadFileResponse, ActivityError> {
        unimplemented!()
    }

    #[activity(name = "local.write_file")]
    pub fn write_file(_req: WriteFileRequest) -> Result<WriteFileResponse, ActivityError> {
        unimplemented!()
    }

    #[activity(name = "local.stop")]
    pub fn stop(_req: StopSandboxRequest) -> Result<Sandbox, ActivityError> {
        unimplemented!()
    }

    #[activity(name = "local.start")]
    pub fn start(_req: StartSandboxRequest) -> Result<Sandbox, ActivityError> {
        unimplemented!()
    }

    /// Returns only the snapshot's id; the data stays in the snapshot store.
    #[activity(name = "local.persist_workspace")]
    pub fn persist_workspace(
        _req: PersistWorkspaceRequest,
    ) -> Result<PersistWorkspaceResponse, ActivityError> {
        unimplemented!()
    }

    #[activity(name = "local.hydrate_workspace")]
    pub fn hydrate_workspace(_req: HydrateWorkspaceRequest) -> Result<Sandbox, ActivityError> {
        unimplemented!()
    }

    #[activity(name = "local.fork")]
    pub fn fork(_req: ForkSandboxRequest) -> Result<ForkSandboxResponse, ActivityError> {
        unimplemented!()
    }
}

/// Sandbox lifecycle on the `e2b` backend (E2B cloud sandboxes), queue
/// `sandbox-provisioner`: the same contracts as [`LocalSandbox`] under the `e2b.` prefix.
pub struct E2bSandbox;

#[activity_definitions]
impl E2bSandbox {
    #[activity(name = "e2b.create")]
    pub fn create(_req: CreateSandboxRequest) -> Result<Sandbox, ActivityError> {
        unimplemented!()
    }

    #[activity(name = "e2b.health")]
    pub fn health(_req: HealthCheckRequest) -> Result<HealthCheckResponse, ActivityError> {
        unimplemented!()
    }

    #[activity(name = "e2b.exec")]
    pub fn exec(_req: ExecRequest) -> Result<ExecResponse, ActivityError> {
        unimplemented!()
    }

    /// git inside the E2B sandbox, against the base commit recorded at create.
    #[activity(name = "e2b.collect_patch")]
    pub fn collect_patch(_req: CollectPatchRequest) -> Result<CollectPatchResponse, ActivityError> {
        unimplemented!()
    }

    #[activity(name = "e2b.destroy")]
    pub fn destroy(_req: DestroySandboxRequest) -> Result<DestroySandboxResponse, ActivityError> {
        unimplemented!()
    }

    #[activity(name = "e2b.get")]
    pub fn get(_req: GetSandboxRequest) -> Result<Sandbox, ActivityError> {
        unimplemented!()
    }

    #[activity(name = "e2b.list")]
    pub fn list(_req: ListSandboxesRequest) -> Result<ListSandboxesResponse, ActivityError> {
        unimplemented!()
    }

    #[activity(name = "e2b.read_file")]
    pub fn read_file(_req: ReadFileRequest) -> Result<ReadFileResponse, ActivityError> {
        unimplemented!()
    }

    #[activity(name = "e2b.write_file")]
    pub fn write_file(_req: WriteFileRequest) -> Result<WriteFileResponse, ActivityError> {
        unimplemented!()
    }
}

/// Agent execution, queue `agent-runner`.
pub struct Agent;

#[activity_definitions]
impl Agent {
    #[activity(name = "agent.run")]
    pub fn run(_req: RunAgentRequest) -> Result<RunAgentResponse, ActivityError> {
        unimplemented!()
    }
}

/// Money, queue `budget-ledger`.
pub struct Ledger;

#[activity_definitions]
impl Ledger {
    #[activity(name = "ledger.open_account")]
    pub fn open_account(_req: OpenAccountRequest) -> Result<Account, ActivityError> {
        unimplemented!()
    }

    #[activity(name = "ledger.create_account")]
    pub fn create_account(_req: CreateAccountRequest) -> Result<Account, ActivityError> {
        unimplemented!()
    }

    #[activity(name = "ledger.get_account")]
    pub fn get_account(_req: GetAccountRequest) -> Result<Account, ActivityError> {
        unimplemented!()
    }

    #[activity(name = "ledger.raise_budget")]
    pub fn raise_budget(_req: RaiseBudgetRequest) -> Result<Account, ActivityError> {
        unimplemented!()
    }

    #[activity(name = "ledger.reserve")]
    pub fn reserve(_req: ReserveRequest) -> Result<Reservation, ActivityError> {
        unimplemented!()
    }

    /// Incremental spend against a HELD reservation.
    #[activity(name = "ledger.charge")]
    pub fn charge(_req: ChargeRequest) -> Result<Reservation, ActivityError> {
        unimplemented!()
    }

    #[activity(name = "ledger.commit")]
    pub fn commit(_req: CommitRequest) -> Result<Reservation, ActivityError> {
        unimplemented!()
    }

    #[activity(name = "ledger.release")]
    pub fn release(_req: ReleaseRequest) -> Result<Reservation, ActivityError> {
        unimplemented!()
    }

    #[activity(name = "ledger.list_postings")]
    pub fn list_postings(_req: ListPostingsRequest) -> Result<ListPostingsResponse, ActivityError> {
        unimplemented!()
    }

    #[activity(name = "ledger.get_spend_report")]
    pub fn get_spend_report(_req: GetSpendReportRequest) -> Result<SpendReport, ActivityError> {
        unimplemented!()
    }
}

/// Orphan sweeping, queue `janitor`.
pub struct JanitorSweep;

#[activity_definitions]
impl JanitorSweep {
    #[activity(name = "janitor.sweep")]
    pub fn sweep(_req: SweepRequest) -> Result<SweepReport, ActivityError> {
        unimplemented!()
    }
}

/// The details an agent activity's failure carries: the agent-runner replica that holds
/// the attempt's transcript, so a fork whose agent failed (budget exceeded, model
/// refused) still has its transcript found by GetForkResult.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct AgentFailureDetails {
    pub transcript_endpoint: String,
}

/// Error types the workflows treat as final (no retry), set on `ActivityError`s.
pub mod errors {
    pub const BUDGET_EXCEEDED: &str = "BudgetExceeded";
    pub const SANDBOX_AUTH: &str = "SandboxAuthError";
    pub const AGENT_TIMEOUT: &str = "AgentTimeout";
    pub const INVALID_INPUT: &str = "InvalidInput";
    pub const NOT_FOUND: &str = "NotFound";
    /// A create refused by a provisioner replica that is shutting down: not the fork's
    /// failure; a replica that takes creates will make it.
    pub const SANDBOX_DRAINING: &str = "SandboxDraining";
    /// The gRPC metadata key a draining replica's refusal carries (`UNAVAILABLE`).
    pub const DRAINING_METADATA: &str = "forkyard-draining";
}

/// The marker types of every definition, public for `#[activity(definition = ...)]` in the
/// implementing crates (the macro's own modules are private), e.g.
/// `#[activity(definition = forkyard_proto::activities::markers::local_sandbox::Create)]`.
/// Workflows call activities through the constants instead: `LocalSandbox::create`.
pub mod markers {
    pub mod local_sandbox {
        pub use super::super::local_sandbox::*;
    }
    pub mod e2b_sandbox {
        pub use super::super::e2b_sandbox::*;
    }
    pub mod agent {
        pub use super::super::agent::*;
    }
    pub mod ledger {
        pub use super::super::ledger::*;
    }
    pub mod janitor_sweep {
        pub use super::super::janitor_sweep::*;
    }
}
