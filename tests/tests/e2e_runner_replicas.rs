//! End to end: two agent-runner replicas on one Temporal, each with its own artifact
//! store. Either replica takes a fork's `agent.run` activity from the shared queue and
//! keeps the transcript; the result names the replica (`transcript_endpoint`) and
//! GetForkResult asks that one, so every fork's transcript is served whichever replica
//! ran it. A replica that is gone takes its transcripts with it: GetForkResult still
//! answers, without the transcript, and the gateway logs a warning.
//!
//! A fork whose agent failed names the replica too: the agent activity's failure
//! carries it in its details.

mod fake_llm;

use fake_llm::{Requests, anthropic_message};
use forkyard_proto::{
    common::v1::{AgentSpec, ForkStatus},
    gateway::v1::{LaunchRunRequest, RunState},
};
use forkyard_tests::{
    Mesh,
    mesh::MeshOptions,
    repo,
    support::{Gateway, fork_result, wait_finished},
};
use serde_json::{Value, json};
use std::{
    path::{Path, PathBuf},
    time::Duration,
};

const KEY: &str = "sk-ant-e2e-SECRET-5151";
const FORKS: u32 = 6;

/// Every fork's agent: write a file, then end the turn. Asked to "overspend", its first
/// turn reports more tokens than the fork's budget covers.
fn answer(_head: &str, body: &Value) -> (u16, Value) {
    let turn = body["messages"].as_array().map_or(0, Vec::len);
    if body["messages"][0].to_string().contains("overspend") {
        let call = json!([{"type": "tool_use", "id": "toolu_rep_9", "name": "list_files",
            "input": {"path": "."}}]);
        return (200, anthropic_message("tool_use", call, 50_000_000, 50));
    }
    if turn <= 1 {
        let call = json!([{"type": "tool_use", "id": "toolu_rep_1", "name": "write_file",
            "input": {"path": "agent.txt", "content": "written by the agent\n"}}]);
        (200, anthropic_message("tool_use", call, 1000, 50))
    } else {
        let text = json!([{"type": "text", "text": "Wrote agent.txt."}]);
        (200, anthropic_message("end_turn", text, 1200, 10))
    }
}

fn launch(repo: &Path, request_id: &str) -> LaunchRunRequest {
    LaunchRunRequest {
        repo: repo.to_string_lossy().into_owned(),
        prompt: "Write agent.txt".into(),
        forks: FORKS,
        max_concurrent: FORKS,
        budget_usd: "1".into(),
        agent: Some(AgentSpec {
            driver: "anthropic".into(),
            model: "haiku".into(),
            ..Default::default()
        }),
        fork_timeout_secs: 120,
        request_id: request_id.into(),
        ..Default::default()
    }
}

/// Each replica's name, endpoint and artifact store.
type Stores = [(&'static str, String, PathBuf); 2];

/// A mesh whose runner reaches the model at `base`, and a second runner replica: the
/// mesh and both replicas' stores.
async fn two_runner_mesh(base: String) -> (Mesh, Stores) {
    let options = MeshOptions {
        env: vec![
            ("ANTHROPIC_API_KEY".into(), KEY.into()),
            ("ANTHROPIC_BASE_URL".into(), base),
        ],
        ..Default::default()
    };
    let mut mesh = Mesh::start_with(options).await.expect("mesh");
    let (b_endpoint, b_state) = mesh
        .start_agent_runner_replica("agent-runner-b")
        .await
        .expect("second agent-runner");
    let a_endpoint = mesh.endpoint("agent-runner");
    let stores = [
        (
            "agent-runner",
            a_endpoint.clone(),
            mesh.state_dir().join("artifacts"),
        ),
        (
            "agent-runner-b",
            b_endpoint.clone(),
            b_state.join("artifacts"),
        ),
    ];
    (mesh, stores)
}

/// Fork `n` succeeded, its transcript is in exactly one replica's store, and its result
/// names that replica and carries that transcript: which replica.
async fn assert_served_by_its_replica(
    gw: &mut Gateway,
    stores: &Stores,
    run_id: &str,
    n: u32,
) -> usize {
    let fork = fork_result(gw, run_id, n).await;
    assert_eq!(fork.status, ForkStatus::Succeeded as i32, "{fork:#?}");
    assert!(
        fork.patch.contains("+written by the agent"),
        "{}",
        fork.patch
    );
    let key = format!("{run_id}/fork-{n}/attempt-1.jsonl");
    let holders: Vec<usize> = (0..2)
        .filter(|i| stores[*i].2.join(&key).is_file())
        .collect();
    assert_eq!(
        holders.len(),
        1,
        "fork {n}'s transcript is on exactly one replica"
    );
    let (name, endpoint, _) = &stores[holders[0]];
    assert_eq!(
        &fork.transcript_endpoint, endpoint,
        "fork {n} ran on {name}: its result names that replica"
    );
    let lines: Vec<Value> = fork
        .transcript
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(
        !lines.is_empty(),
        "fork {n} (ran on {name}) has no transcript"
    );
    assert_eq!(lines[0]["type"], "start");
    assert_eq!(lines[0]["run_id"], run_id);
    assert_eq!(lines[0]["fork"], n);
    assert_eq!(lines.last().unwrap()["type"], "end");
    assert!(!fork.transcript.contains(KEY));
    holders[0]
}

/// Temporal hands each activity task to whichever poller asks: run until forks have
/// landed on both replicas (each run is checked in full). A fork that ran on the second
/// replica, if any did.
async fn run_until_both_replicas_ran(
    gw: &mut Gateway,
    repo_dir: &Path,
    stores: &Stores,
) -> Option<(String, u32)> {
    let mut on_b: Option<(String, u32)> = None;
    let mut ran_on = [0u32; 2];
    for attempt in 1..=3 {
        let run_id = gw
            .launch_run(launch(repo_dir, &format!("replicas-{attempt}")))
            .await
            .expect("launch")
            .into_inner()
            .run_id;
        let run = wait_finished(gw, &run_id, Duration::from_secs(180)).await;
        assert_eq!(run.state, RunState::Completed as i32, "{run:#?}");
        for n in 1..=FORKS {
            let holder = assert_served_by_its_replica(gw, stores, &run_id, n).await;
            ran_on[holder] += 1;
            if holder == 1 {
                on_b = Some((run_id.clone(), n));
            }
        }
        eprintln!(
            "after run {attempt}: forks ran on agent-runner {} / agent-runner-b {}",
            ran_on[0], ran_on[1]
        );
        if ran_on.iter().all(|n| *n > 0) {
            break;
        }
    }
    assert!(
        ran_on.iter().all(|n| *n > 0),
        "in three runs of {FORKS} forks every agent ran on one replica: {ran_on:?}"
    );
    on_b
}

/// A fork whose agent failed (its budget refused a turn) has no agent response, yet
/// its result names the replica holding its transcript (from the failure's details).
async fn assert_failed_forks_name_their_replica(
    gw: &mut Gateway,
    repo_dir: &Path,
    stores: &Stores,
) {
    let mut failed_on = [0u32; 2];
    for attempt in 1..=3 {
        let run_id = gw
            .launch_run(LaunchRunRequest {
                prompt: "overspend".into(),
                ..launch(repo_dir, &format!("overspend-{attempt}"))
            })
            .await
            .expect("launch")
            .into_inner()
            .run_id;
        wait_finished(gw, &run_id, Duration::from_secs(180)).await;
        for n in 1..=FORKS {
            let fork = fork_result(gw, &run_id, n).await;
            assert_eq!(fork.status, ForkStatus::BudgetExceeded as i32, "{fork:#?}");
            let key = format!("{run_id}/fork-{n}/attempt-1.jsonl");
            let holder = (0..2)
                .find(|i| stores[*i].2.join(&key).is_file())
                .unwrap_or_else(|| panic!("fork {n} of {run_id} left no transcript"));
            failed_on[holder] += 1;
            assert_eq!(
                fork.transcript_endpoint, stores[holder].1,
                "failed fork {n} ran on {}: its result names that replica",
                stores[holder].0
            );
            assert!(
                fork.transcript.contains("\"start\""),
                "failed fork {n}: {}",
                fork.transcript
            );
        }
        if failed_on[1] > 0 {
            break;
        }
    }
    assert!(
        failed_on[1] > 0,
        "no failed fork ran on agent-runner-b: {failed_on:?}"
    );
}

/// The second replica goes away: its forks still answer, without the transcript, and
/// the gateway warns.
async fn assert_a_gone_replicas_forks_answer(
    mesh: &mut Mesh,
    gw: &mut Gateway,
    on_b: (String, u32),
    b_endpoint: &str,
) {
    let (run_id, n) = on_b;
    mesh.kill9("agent-runner-b");
    let fork = fork_result(gw, &run_id, n).await;
    assert_eq!(fork.status, ForkStatus::Succeeded as i32, "{fork:#?}");
    assert!(fork.patch.contains("+written by the agent"));
    assert_eq!(fork.transcript_endpoint, b_endpoint);
    assert!(fork.transcript.is_empty(), "{}", fork.transcript);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !mesh
        .log_tail("gateway")
        .contains("transcript not available")
    {
        assert!(
            std::time::Instant::now() < deadline,
            "no warning about the missing transcript in the gateway log:\n{}",
            mesh.log_tail("gateway")
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_fork_result_serves_transcripts_from_the_replica_that_ran_the_agent() {
    let requests = Requests::default();
    let base = fake_llm::serve(answer, requests.clone()).await;
    let (mut mesh, stores) = two_runner_mesh(base).await;
    let dir = tempfile::tempdir().unwrap();
    let repo_dir = dir.path().join("repo");
    repo::create(&repo_dir).unwrap();
    let mut gw = Gateway::new(mesh.channel("gateway").await.unwrap());

    let on_b = run_until_both_replicas_ran(&mut gw, &repo_dir, &stores).await;
    assert_failed_forks_name_their_replica(&mut gw, &repo_dir, &stores).await;
    let on_b = on_b.expect("a fork ran on agent-runner-b");
    assert_a_gone_replicas_forks_answer(&mut mesh, &mut gw, on_b, &stores[1].1).await;
}
