//! `ScheduledCleanupWorkflow`: one tick of the janitor's Temporal Schedule. The sweep
//! itself is the `janitor.sweep` activity on the janitor's queue.

use forkyard_proto::{
    activities::JanitorSweep,
    janitor::v1::{SweepReport, SweepRequest},
    queues,
};
use std::time::Duration;
use temporalio_common::RetryPolicy;
use temporalio_macros::{workflow, workflow_methods};
use temporalio_workflow::{ActivityOptions, WorkflowContext, WorkflowResult};

#[workflow]
#[derive(Default)]
pub struct ScheduledCleanupWorkflow;

#[workflow_methods]
impl ScheduledCleanupWorkflow {
    #[run(name = "ScheduledCleanupWorkflow")]
    pub async fn run(
        ctx: &mut WorkflowContext<Self>,
        req: SweepRequest,
    ) -> WorkflowResult<SweepReport> {
        let opts = ActivityOptions::with_start_to_close_timeout(Duration::from_secs(600))
            .task_queue(queues::JANITOR.to_owned())
            .retry_policy(
                RetryPolicy::builder()
                    .maximum_attempts(3)
                    .initial_interval(Duration::from_secs(2))
                    .backoff_coefficient(2.0)
                    .build(),
            )
            .build();
        Ok(ctx.execute_activity(JanitorSweep::sweep, req, opts).await?)
    }
}
