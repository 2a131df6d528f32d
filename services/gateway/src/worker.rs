//! The gateway's Temporal worker: the run, fork and cleanup workflows, and the local
//! activities they call (a wave's preparation and finish, the ledger's and the
//! provisioners' calls) on the orchestration queue.

use crate::{
    activities::{
        deliver::DeliverLocal, host::WaveLocal, ledger::LedgerLocal, sandboxes::SandboxLocal,
    },
    workflows::{
        ForkWorkflow, PublishWorkflow, SandboxOrchestrationWorkflow,
        cleanup::ScheduledCleanupWorkflow,
    },
};
use forkyard_proto::queues;
use temporalio_sdk::{WorkerOptions, runtime::PollerBehavior};

/// How the worker takes workflow tasks.
pub struct Tasks {
    /// Concurrent polls; unset keeps the SDK's default.
    pub pollers: Option<usize>,
    /// How long a task waits on this worker's sticky queue before any worker takes it.
    pub sticky_timeout: std::time::Duration,
}

/// The worker's options.
pub fn options(
    ledger: LedgerLocal,
    sandboxes: SandboxLocal,
    deliver: DeliverLocal,
    tasks: Tasks,
) -> anyhow::Result<WorkerOptions> {
    Ok(WorkerOptions::new(queues::ORCHESTRATION)
        .register_workflow::<SandboxOrchestrationWorkflow>()?
        .register_workflow::<ForkWorkflow>()?
        .register_workflow::<PublishWorkflow>()?
        .register_workflow::<ScheduledCleanupWorkflow>()?
        .worker_plugin(crate::fork_telemetry::plugin())
        .register_activities(WaveLocal::new(&ledger, &sandboxes))
        .register_activities(deliver)
        .register_activities(ledger)
        .register_activities(sandboxes)
        .maybe_workflow_task_poller_behavior(tasks.pollers.map(PollerBehavior::SimpleMaximum))
        .sticky_queue_schedule_to_start_timeout(tasks.sticky_timeout)
        .build())
}
