//! End to end: a run of more than 300 forks runs them inline (the gateway's default
//! `--inline-fork-limit` is every run `--max-forks` allows), and its history stays small
//! however much its forks print: each fork keeps only the tail of its agent's and its
//! verify's output, and a smaller share of its patch, in the run's history.

use forkyard_proto::{
    common::v1::{ForkStatus, VerifyStatus},
    gateway::v1::{LaunchRunRequest, RunState, gateway_client::GatewayClient},
};
use forkyard_tests::{
    Mesh, repo,
    support::{fork_result, launch, wait_finished, workspaces_left},
};
use std::time::Duration;

const FORKS: u32 = 320;

/// About 110 KB of output, its last line `20000`, and a file changed.
const AGENT: &str = r#"seq 1 20000; echo "fork $FORKYARD_FORK" > "fork-$FORKYARD_FORK.txt""#;
/// About 290 KB on each stream, their last lines `50000` and `error 50000`.
const VERIFY: &str = r#"seq 1 50000; seq 1 50000 | sed 's/^/error /' >&2"#;

fn temporal_json(mesh: &Mesh, what: &str, run_id: &str) -> serde_json::Value {
    let out = std::process::Command::new(forkyard_tests::mesh::temporal_cli())
        .args(["workflow", what, "-o", "json", "--address"])
        .arg(mesh.temporal_address())
        .args(["-w", run_id])
        .output()
        .expect("temporal cli");
    serde_json::from_slice(&out.stdout).expect("temporal cli json")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_of_320_forks_runs_inline_and_keeps_its_history_small() {
    let mesh = Mesh::start().await.expect("mesh");
    let src = tempfile::tempdir().unwrap();
    repo::create(src.path()).unwrap();
    let mut gw = GatewayClient::new(mesh.channel("gateway").await.unwrap());
    let launched = gw
        .launch_run(LaunchRunRequest {
            request_id: "e2e-large-run".into(),
            verify_command: VERIFY.into(),
            budget_usd: "10".into(),
            ..launch(src.path(), FORKS, 40, AGENT)
        })
        .await
        .expect("launch")
        .into_inner();
    let run = wait_finished(&mut gw, &launched.run_id, Duration::from_secs(600)).await;
    assert_eq!(run.state, RunState::Completed as i32, "{run:#?}");
    assert_eq!(run.forks_succeeded, FORKS, "{run:#?}");

    for n in [1, FORKS / 2, FORKS] {
        let fork = fork_result(&mut gw, &launched.run_id, n).await;
        assert_eq!(fork.status, ForkStatus::Succeeded as i32, "{fork:#?}");
        assert_eq!(fork.verify, VerifyStatus::Passed as i32);
        assert!(fork.patch.contains(&format!("+fork {n}")), "{}", fork.patch);
        // The ends of what was printed, and only a share of it (3 MiB / 1.5 MiB / 768 KiB
        // over 320 forks: 9,830 / 4,915 / 1,228 bytes a stream).
        assert!(
            fork.agent_output_tail.ends_with("19999\n20000\n"),
            "{:?}",
            &fork.agent_output_tail[fork.agent_output_tail.len().saturating_sub(40)..]
        );
        assert!(
            fork.agent_output_tail.len() <= 4915,
            "{}",
            fork.agent_output_tail.len()
        );
        let (out, err) = fork
            .verify_output_tail
            .split_once("\n--- stderr ---\n")
            .expect("both streams");
        assert!(out.ends_with("49999\n50000\n"), "{out:?}");
        assert!(err.ends_with("error 49999\nerror 50000\n"), "{err:?}");
        assert!(
            out.len() <= 1228 && err.len() <= 1228,
            "{} {}",
            out.len(),
            err.len()
        );
    }

    // No child workflow: every fork ran in the run's own history, which stays far below
    // Temporal's warnings (10,240 events, 10 MiB).
    let described = temporal_json(&mesh, "describe", &launched.run_id);
    let info = &described["workflowExecutionInfo"];
    let events: u64 = info["historyLength"].as_str().unwrap().parse().unwrap();
    let bytes: u64 = info["historySizeBytes"].as_str().unwrap().parse().unwrap();
    assert!(events < 10_240 / 2, "{events} events");
    assert!(bytes < 4 << 20, "{bytes} bytes of history");
    let history = temporal_json(&mesh, "show", &launched.run_id);
    let children = history["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| {
            e.get("startChildWorkflowExecutionInitiatedEventAttributes")
                .is_some()
        })
        .count();
    assert_eq!(children, 0, "forks ran inline");
    assert!(
        workspaces_left(mesh.state_dir()).is_empty(),
        "every sandbox destroyed"
    );
}
