//! What every activity adds to its trace span, its logs and the run metrics.
//!
//! The Temporal SDK's OpenTelemetry plugin opens a `RunActivity:<type>` span per activity
//! attempt, child of the workflow's `StartActivity:<type>` span (context carried in the
//! Temporal header). This interceptor runs inside that span (it is registered after the
//! plugin, so it is the inner one) and, from the typed activity input and output:
//! - sets the attributes an SRE filters by: `forkyard.run_id`, `forkyard.fork`,
//!   `forkyard.sandbox_id`, `forkyard.model`, token counts and `forkyard.cost_usd`
//!   (errors already set the span's status in the plugin);
//! - opens a `tracing` span with `run_id` / `fork` so the activity's log lines carry them;
//! - counts retried attempts (`activity_retries_total{activity_type}`) and records the
//!   agent's cost (`agent_cost_usd`) in the agent runner. The sandbox metrics are the
//!   provisioner's own (`sandbox_created_total` and co., counted where a sandbox is made
//!   or removed, whether a gRPC call or an activity asked).
//!
//! Only identifiers and numbers are read: never commands, env, prompts or file contents.

use crate::metrics;
use forkyard_proto::{
    agent::v1::{RunAgentRequest, RunAgentResponse},
    budget::v1::{CommitRequest, ReserveRequest},
    labels,
    sandbox::v1::{
        CollectPatchRequest, CreateSandboxRequest, DestroySandboxRequest, ExecRequest,
        HealthCheckRequest, Sandbox,
    },
};
use opentelemetry::{Context, KeyValue, trace::TraceContextExt as _};
use std::sync::Arc;
use temporalio_sdk::{
    SimplePlugin,
    interceptors::{ActivityInboundInterceptor, ExecuteActivityInput, ExecuteActivityOutput, Next},
};
use tracing::Instrument as _;

/// Activity attempts after the first, by activity: what the retry policies are spending.
static RETRIES: std::sync::LazyLock<prometheus::IntCounterVec> = std::sync::LazyLock::new(|| {
    let retries = prometheus::IntCounterVec::new(
        prometheus::Opts::new(
            "activity_retries_total",
            "Activity attempts after the first, by activity type",
        ),
        &["activity_type"],
    )
    .expect("valid metric");
    let _ = metrics::registry().register(Box::new(retries.clone()));
    retries
});

/// The plugin that installs the interceptor on every worker built from the client.
pub fn plugin() -> SimplePlugin {
    SimplePlugin::builder("forkyard-activity-telemetry")
        .activity_inbound_interceptors(vec![
            Arc::new(ActivityTelemetry) as Arc<dyn ActivityInboundInterceptor>
        ])
        .build()
}

struct ActivityTelemetry;

/// Identifiers read from an activity's input.
#[derive(Default)]
struct Ids {
    run_id: String,
    fork: Option<u32>,
    sandbox_id: String,
    model: String,
}

impl Ids {
    fn of(input: &ExecuteActivityInput) -> Ids {
        let mut ids = Ids::default();
        if let Some(r) = input.args_ref::<CreateSandboxRequest>() {
            ids.run_id = r.labels.get(labels::RUN_ID).cloned().unwrap_or_default();
            ids.fork = r.labels.get(labels::FORK).and_then(|f| f.parse().ok());
        } else if let Some(r) = input.args_ref::<RunAgentRequest>() {
            ids.run_id = r.run_id.clone();
            ids.fork = Some(r.fork);
            ids.sandbox_id = r.sandbox_id.clone();
            ids.model = r
                .agent
                .as_ref()
                .map(|a| a.model.clone())
                .unwrap_or_default();
        } else if let Some(r) = input.args_ref::<DestroySandboxRequest>() {
            ids.sandbox_id = r.sandbox_id.clone();
        } else if let Some(r) = input.args_ref::<ExecRequest>() {
            ids.sandbox_id = r.sandbox_id.clone();
        } else if let Some(r) = input.args_ref::<HealthCheckRequest>() {
            ids.sandbox_id = r.sandbox_id.clone();
        } else if let Some(r) = input.args_ref::<CollectPatchRequest>() {
            ids.sandbox_id = r.sandbox_id.clone();
        } else if let Some(r) = input.args_ref::<ReserveRequest>() {
            // A run's ledger account is named by its run id.
            ids.run_id = r.account_id.clone();
        }
        ids
    }

    fn attributes(&self) -> Vec<KeyValue> {
        let mut attrs = Vec::new();
        if !self.run_id.is_empty() {
            attrs.push(KeyValue::new("forkyard.run_id", self.run_id.clone()));
        }
        if let Some(fork) = self.fork {
            attrs.push(KeyValue::new("forkyard.fork", i64::from(fork)));
        }
        if !self.sandbox_id.is_empty() {
            attrs.push(KeyValue::new(
                "forkyard.sandbox_id",
                self.sandbox_id.clone(),
            ));
        }
        if !self.model.is_empty() {
            attrs.push(KeyValue::new("forkyard.model", self.model.clone()));
        }
        attrs
    }
}

fn usd(micros: i64) -> f64 {
    forkyard_proto::Usd::from_micros(micros).dollars_f64()
}

impl ActivityInboundInterceptor for ActivityTelemetry {
    fn execute_activity<'a>(
        &'a self,
        input: ExecuteActivityInput,
        next: Next<'a, ExecuteActivityInput, ExecuteActivityOutput<'a>>,
    ) -> ExecuteActivityOutput<'a> {
        let activity = input.activity_info().activity_type.clone();
        let attempt = input.activity_info().attempt;
        if attempt > 1 {
            RETRIES.with_label_values(&[activity.as_str()]).inc();
        }
        let ids = Ids::of(&input);
        let commit_micros = input.args_ref::<CommitRequest>().map(|r| r.amount_micros);
        let log_span = tracing::info_span!(
            "activity",
            activity = %activity,
            run_id = tracing::field::Empty,
            fork = tracing::field::Empty,
        );
        if !ids.run_id.is_empty() {
            log_span.record("run_id", ids.run_id.as_str());
        }
        if let Some(fork) = ids.fork {
            log_span.record("fork", fork);
        }
        Box::pin(
            async move {
                // Polled inside the plugin's activity span.
                let cx = Context::current();
                let span = cx.span();
                span.set_attributes(ids.attributes());
                span.set_attribute(KeyValue::new("forkyard.attempt", i64::from(attempt)));
                if let Some(micros) = commit_micros {
                    span.set_attribute(KeyValue::new("forkyard.cost_usd", usd(micros)));
                }
                let result = next.run(input).await;
                let run = metrics::run();
                if let Ok(out) = &result {
                    if let Some(sandbox) = out.downcast_ref::<Sandbox>()
                        && activity.ends_with(".create")
                    {
                        span.set_attribute(KeyValue::new(
                            "forkyard.sandbox_id",
                            sandbox.id.clone(),
                        ));
                    }
                    if let Some(resp) = out.downcast_ref::<RunAgentResponse>() {
                        let usage = resp.usage.unwrap_or_default();
                        span.set_attributes([
                            KeyValue::new("forkyard.input_tokens", usage.input_tokens as i64),
                            KeyValue::new("forkyard.output_tokens", usage.output_tokens as i64),
                            KeyValue::new("forkyard.cost_usd", usd(resp.cost_micros)),
                            KeyValue::new("forkyard.agent_exit_code", i64::from(resp.exit_code)),
                        ]);
                        let model = if ids.model.is_empty() {
                            "none"
                        } else {
                            &ids.model
                        };
                        run.agent_cost
                            .with_label_values(&[model])
                            .observe(usd(resp.cost_micros));
                    }
                }
                result
            }
            .instrument(log_span),
        )
    }
}
