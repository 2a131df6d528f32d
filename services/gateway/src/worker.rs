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

/// The worker's options; `workflow_task_pollers` unset keeps the SDK's default.
pub fn options(
    ledger: LedgerLocal,
    sandboxes: SandboxLocal,
    deliver: DeliverLocal,
    workflow_task_pollers: Option<usize>,
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
        .maybe_workflow_task_poller_behavior(
            workflow_task_pollers.map(PollerBehavior::SimpleMaximum),
        )
        .build())
}
