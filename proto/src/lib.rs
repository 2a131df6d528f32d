//! Forkyard's v1 contracts.
//!
//! The protobuf messages are both the gRPC bodies and the Temporal activity inputs and
//! outputs, so each contract has one definition. [`activities`] declares every activity a
//! workflow can call (name, input, output); each service implements its part with
//! `#[activity(definition = ...)]`, and workflows call them on the owner's task queue.
#![forbid(unsafe_code)]

#[cfg(feature = "activities")]
pub mod activities;
pub mod backends;
pub mod driver;
pub mod ids;
pub mod money;

pub use driver::Driver;
pub use money::{MICROS_PER_USD, Usd};

/// Where a command's LLM gateway is inside its sandbox (`ExecRequest.llm_gateway`): the
/// sandbox's own loopback, relayed by the provisioner. Inside, `FORKYARD_LLM_URL` is
/// `http://` and this.
pub const SANDBOX_LLM_ADDR: &str = "127.0.0.1:4000";

/// The isolation levels a local sandbox can have (`CreateSandboxRequest.isolation`,
/// `LaunchRunRequest.isolation`), the default first: bubblewrap's namespaces over the
/// host's kernel, or gVisor's user-space kernel (`runsc`).
pub const ISOLATIONS: &[&str] = &["bubblewrap", "gvisor"];

/// The sandbox backends a run can name (`LaunchRunRequest.backend`,
/// `CreateSandboxRequest.backend`): the provisioners' own hosts, or E2B's cloud. Which
/// of them a mesh offers, the provisioners say (`ListBackends`).
pub const BACKENDS: &[&str] = &["local", "e2b"];

/// Whether a sandbox id is one of a backend whose sandboxes run off the mesh's hosts
/// (E2B's `e2b-…`): no relay of the provisioner reaches into it, so its agent's model
/// traffic goes to the operator's public LLM gateway URL instead.
pub fn remote_sandbox(sandbox_id: &str) -> bool {
    sandbox_id.starts_with("e2b-")
}

pub mod common {
    pub mod v1 {
        tonic::include_proto!("forkyard.common.v1");
    }
}
pub mod gateway {
    pub mod v1 {
        tonic::include_proto!("forkyard.gateway.v1");
    }
}
pub mod sandbox {
    pub mod v1 {
        tonic::include_proto!("forkyard.sandbox.v1");
    }
}
pub mod agent {
    pub mod v1 {
        tonic::include_proto!("forkyard.agent.v1");
    }
}
pub mod budget {
    pub mod v1 {
        tonic::include_proto!("forkyard.budget.v1");
    }
}
pub mod janitor {
    pub mod v1 {
        tonic::include_proto!("forkyard.janitor.v1");
    }
}

/// Encoded `FileDescriptorSet` of every Forkyard service, for gRPC server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("forkyard_descriptor");

/// Temporal task queues, one per service.
pub mod queues {
    pub const ORCHESTRATION: &str = "forkyard-orchestration";
    pub const SANDBOX_PROVISIONER: &str = "sandbox-provisioner";
    pub const AGENT_RUNNER: &str = "agent-runner";
    pub const BUDGET_LEDGER: &str = "budget-ledger";
    pub const JANITOR: &str = "janitor";
}

/// Labels the provisioner stores on every sandbox a fork creates.
pub mod labels {
    pub const RUN_ID: &str = "forkyard.run_id";
    pub const FORK: &str = "forkyard.fork";
    /// The fork workflow that owns the sandbox; the janitor checks it is still running.
    pub const WORKFLOW_ID: &str = "forkyard.workflow_id";
}
