//! Writes one workflow's history as the Temporal SDK's replayer reads it
//! (`WorkflowHistory::to_json`), for `services/gateway/tests/histories/`:
//!
//!   cargo run -p forkyard-tests --bin record-history -- <workflow-id> > <file>.json
//!
//! Temporal from TEMPORAL_ADDRESS / TEMPORAL_NAMESPACE (`--temporal-address`, …).

use clap::Parser;
use std::io::Write;
use temporalio_client::{UntypedWorkflow, WorkflowFetchHistoryOptions};

#[derive(Parser)]
#[command(about = "Print a workflow's history as the Temporal SDK's replayer reads it")]
struct Args {
    /// The workflow id (a run id, or `<run-id>/fork-<n>` for a fork's child workflow).
    workflow_id: String,
    #[command(flatten)]
    temporal: forkyard_common::TemporalArgs,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let client = forkyard_common::temporal::connect_once(&args.temporal, "record-history").await?;
    let json = client
        .get_workflow_handle::<UntypedWorkflow>(&args.workflow_id)
        .fetch_history(WorkflowFetchHistoryOptions::default())
        .to_json()
        .await?;
    std::io::stdout().write_all(&json)?;
    Ok(())
}
