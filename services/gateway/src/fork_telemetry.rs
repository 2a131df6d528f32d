//! Fork and run telemetry observed from the workflow worker, without I/O in workflow code.
//!
//! A workflow interceptor, installed as a worker plugin so it runs inside the Temporal
//! OpenTelemetry plugin's `RunWorkflow:*` span:
//! - puts `forkyard.run_id` (and for forks `forkyard.fork`, `forkyard.model`, and at the
//!   end `forkyard.sandbox_id`, tokens, `forkyard.cost_usd`, `forkyard.status`) on the
//!   workflow's span, and sets the span's status to error when a fork did not succeed
//!   (a failed fork is a result, not a workflow error, so the plugin would not);
//! - records `sandbox_fork_completed_total{status,model}`,
//!   `sandbox_fork_duration_seconds{status}` and `sandbox_fork_cost_usd{model}` when a
//!   fork workflow returns its result.
//!
//! Replay safety: nothing here changes commands or results. Metrics are recorded only
//! when the result is produced outside replay (a workflow re-run from history after a
//! cache eviction does not count twice), and span writes during replay go to the
//! plugin's non-recording replay span.

use crate::{fork_metrics::record, workflows::ForkInput};
use forkyard_common::telemetry::otel::{
    Context, KeyValue,
    trace::{Status, TraceContextExt as _},
};
use forkyard_proto::common::v1::ForkResult;
use temporalio_sdk::{
    SimplePlugin,
    workflow_interceptors::{
        ExecuteWorkflowInput, ExecuteWorkflowResult, WorkflowInterceptor,
        WorkflowInterceptorConstructor, WorkflowInterceptorContext, WorkflowInterceptorFuture,
        WorkflowNext,
    },
};

const FORK_WORKFLOW: &str = "ForkWorkflow";
const RUN_WORKFLOW: &str = "SandboxOrchestrationWorkflow";

/// The worker plugin; register it on the gateway's `WorkerOptions` (worker plugins apply
/// after the client's, so this interceptor is inside the tracing one).
pub fn plugin() -> SimplePlugin {
    SimplePlugin::builder("forkyard-fork-telemetry")
        .workflow_interceptors(vec![WorkflowInterceptorConstructor::new(|_| ForkTelemetry)])
        .build()
}

struct ForkTelemetry;

impl WorkflowInterceptor for ForkTelemetry {
    fn execute<'a>(
        &'a self,
        ctx: WorkflowInterceptorContext,
        input: ExecuteWorkflowInput,
        next: WorkflowNext<
            'a,
            ExecuteWorkflowInput,
            WorkflowInterceptorFuture<'a, ExecuteWorkflowResult>,
        >,
    ) -> WorkflowInterceptorFuture<'a, ExecuteWorkflowResult> {
        let mut attrs = Vec::new();
        let mut model = String::new();
        match ctx.workflow_type() {
            FORK_WORKFLOW => {
                if let Some(fork) = input.input_ref::<ForkInput>() {
                    model = fork
                        .spec
                        .agent
                        .as_ref()
                        .map(|a| a.model.clone())
                        .unwrap_or_default();
                    attrs.push(KeyValue::new("forkyard.run_id", fork.run_id.clone()));
                    attrs.push(KeyValue::new("forkyard.fork", i64::from(fork.fork)));
                    attrs.push(KeyValue::new("forkyard.model", model.clone()));
                }
            }
            RUN_WORKFLOW => {
                // The run id is the orchestration workflow's id.
                attrs.push(KeyValue::new(
                    "forkyard.run_id",
                    ctx.workflow_id().to_owned(),
                ));
            }
            _ => return next.run(input),
        }
        WorkflowInterceptorFuture::new(async move {
            Context::current().span().set_attributes(attrs);
            let result = next.run(input).await;
            if let Ok(out) = &result
                && let Some(fork) = out.downcast_ref::<ForkResult>()
                && !ctx.is_replaying_history_events()
            {
                let (status, attrs) = record(fork, &model);
                let cx = Context::current();
                cx.span().set_attributes(attrs);
                if status != "succeeded" {
                    cx.span().set_status(Status::error(fork.error.clone()));
                }
            }
            result
        })
    }
}
