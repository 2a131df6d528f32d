//! How the gateway's delivery activity reads a fork's whole result (its patch) from the
//! workflows that keep it: the run's query for an inline fork, the child's result
//! otherwise (`crate::activities::deliver::ForkResults`).

use super::{fork::ForkWorkflow, run_state::SandboxOrchestrationWorkflow};
use crate::activities::deliver::ForkResults;
use forkyard_proto::common::v1::ForkResult;
use std::sync::Arc;
use temporalio_client::{WorkflowGetResultOptions, WorkflowQueryOptions};

/// How the delivery activity reads a fork's whole result, through `client`: the run's
/// query for an inline fork, the child's result otherwise.
pub fn fork_results(client: temporalio_client::Client) -> ForkResults {
    Arc::new(move |run_id, fork| {
        let client = client.clone();
        Box::pin(async move { fork_result(&client, &run_id, fork).await })
    })
}

/// A fork's whole result: the run keeps an inline fork's, a child its own.
async fn fork_result(
    client: &temporalio_client::Client,
    run_id: &str,
    fork: u32,
) -> Result<ForkResult, String> {
    let run = client.get_workflow_handle::<SandboxOrchestrationWorkflow>(run_id);
    let inline = run
        .query(
            SandboxOrchestrationWorkflow::fork_result,
            fork,
            WorkflowQueryOptions::default(),
        )
        .await
        .map_err(|e| format!("fork {fork}'s result: {e}"))?;
    if let Some(full) = inline {
        return Ok(full);
    }
    client
        .get_workflow_handle::<ForkWorkflow>(
            forkyard_proto::ids::ForkId::new(run_id, fork).to_string(),
        )
        .get_result(WorkflowGetResultOptions::default())
        .await
        .map_err(|e| format!("fork {fork}'s result: {e}"))
}
