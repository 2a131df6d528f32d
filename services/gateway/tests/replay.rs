//! Rolling upgrades: every workflow history recorded by an earlier build
//! (`tests/histories/*.json`, `temporal workflow show --output json`) replays on this
//! build's workflow code without nondeterminism. A workflow change that a run in flight
//! would trip over (a new command where the old history has another) fails here; such a
//! change must sit behind a patch (`ctx.patched(..)`), so runs started by the old build
//! keep their course when the new one takes them over. How to record more: the README of
//! `tests/histories/`.

use forkyard_gateway::workflows::{
    ForkWorkflow, PublishWorkflow, SandboxOrchestrationWorkflow, cleanup::ScheduledCleanupWorkflow,
};
use std::path::PathBuf;
use temporalio_client::WorkflowHistory;
use temporalio_sdk::workflow_replayer::{WorkflowReplayer, WorkflowReplayerOptions};

fn histories() -> Vec<(String, WorkflowHistory)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/histories");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|p| {
            let bytes = std::fs::read(&p).unwrap();
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            let history = WorkflowHistory::from_json(&bytes)
                .unwrap_or_else(|e| panic!("{name} is not a workflow history: {e}"));
            (name, history)
        })
        .collect()
}

#[tokio::test]
async fn histories_of_earlier_builds_replay_on_this_build() {
    let options = WorkflowReplayerOptions::new()
        .register_workflow::<SandboxOrchestrationWorkflow>()
        .unwrap()
        .register_workflow::<ForkWorkflow>()
        .unwrap()
        .register_workflow::<ScheduledCleanupWorkflow>()
        .unwrap()
        .register_workflow::<PublishWorkflow>()
        .unwrap()
        .build();
    let replayer = WorkflowReplayer::new(options).expect("replayer");
    let histories = histories();
    assert!(
        histories.len() >= 3,
        "the recorded histories are missing: {}",
        histories.len()
    );
    let (names, histories): (Vec<_>, Vec<_>) = histories.into_iter().unzip();
    let results = replayer
        .replay_workflows(histories)
        .await
        .expect("the replay worker runs");
    let failed: Vec<String> = names
        .iter()
        .zip(&results)
        .filter_map(|(n, r)| r.replay_failure.as_ref().map(|f| format!("{n}: {f}")))
        .collect();
    assert!(
        failed.is_empty(),
        "histories that no longer replay:\n{}",
        failed.join("\n")
    );
}
