//! End to end: a run with the `anthropic` driver through the real mesh. The model is a
//! local server speaking the Messages API; the agent-runner is pointed at it with
//! ANTHROPIC_BASE_URL. Checks launch-time refusals, the fork's patch, tokens, cost (in
//! the result and in the ledger) and transcript, and that the key is in no log.

mod fake_llm;

use fake_llm::{Requests, api_error};
use forkyard_proto::{
    common::v1::{AgentSpec, ForkResult, ForkStatus},
    gateway::v1::{LaunchRunRequest, RunState},
};
use forkyard_tests::{
    Mesh,
    mesh::MeshOptions,
    repo,
    support::{Gateway, Ledger, fork_result, run_account, wait_finished},
};
use serde_json::{Value, json};
use std::{
    collections::VecDeque,
    path::Path,
    sync::{Arc, Mutex},
    time::Duration,
};
use tonic::Code;

const KEY: &str = "sk-ant-e2e-SECRET-7373";

type Script = Arc<Mutex<(VecDeque<(u16, Value)>, Vec<(String, Value)>)>>;

/// The local Messages API: answers from `script` in order, records each request's head
/// and body next to it.
async fn anthropic_server(script: Script) -> String {
    let answer = move |head: &str, body: &Value| {
        let mut s = script.lock().unwrap();
        s.1.push((head.to_owned(), body.clone()));
        s.0.pop_front()
            .unwrap_or_else(|| (500, api_error("api_error", "script exhausted")))
    };
    fake_llm::serve(answer, Requests::default()).await
}

fn message(stop: &str, content: Value, input: u64, output: u64) -> Value {
    json!({"id": "msg_e2e", "type": "message", "role": "assistant", "model": "claude-haiku-4-5",
        "stop_reason": stop, "content": content,
        "usage": {"input_tokens": input, "output_tokens": output,
                  "cache_creation_input_tokens": 0, "cache_read_input_tokens": 100}})
}

fn launch(repo: &std::path::Path, driver: &str, model: &str) -> LaunchRunRequest {
    LaunchRunRequest {
        repo: repo.to_string_lossy().into_owned(),
        prompt: "Append a line four to src/lib.txt".into(),
        forks: 1,
        max_concurrent: 1,
        budget_usd: "1".into(),
        agent: Some(AgentSpec {
            driver: driver.into(),
            model: model.into(),
            ..Default::default()
        }),
        fork_timeout_secs: 120,
        ..Default::default()
    }
}

/// The model's side of an edit: a tool call adding line four, then the end of the turn.
fn script_an_edit(script: &Script) {
    let mut s = script.lock().unwrap();
    s.0.push_back((200, message("tool_use", json!([
        {"type": "text", "text": "Editing."},
        {"type": "tool_use", "id": "toolu_e2e_1", "name": "edit",
         "input": {"path": "src/lib.txt", "old_string": "three\n", "new_string": "three\nfour\n"}}]), 1200, 80)));
    s.0.push_back((
        200,
        message(
            "end_turn",
            json!([{"type": "text", "text": "Added line four."}]),
            1500,
            20,
        ),
    ));
}

/// Launches `req` under `request_id`: the run's id.
async fn launch_as(gw: &mut Gateway, mut req: LaunchRunRequest, request_id: &str) -> String {
    req.request_id = request_id.into();
    gw.launch_run(req)
        .await
        .expect("launch")
        .into_inner()
        .run_id
}

/// Refused at launch, before anything starts: a model the driver does not know, a driver
/// that does not exist, a provider whose key the runner lacks.
async fn assert_refused_at_launch(gw: &mut Gateway, repo_dir: &Path, script: &Script) {
    let err = gw
        .launch_run(launch(repo_dir, "anthropic", "sonet"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(
        err.message().starts_with("agent.model"),
        "{}",
        err.message()
    );
    let err = gw
        .launch_run(launch(repo_dir, "gpt-pilot", ""))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(
        err.message().starts_with("agent.driver"),
        "{}",
        err.message()
    );
    let err = gw
        .launch_run(launch(repo_dir, "openai", "gpt-4o"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(
        err.message().contains("OPENAI_API_KEY"),
        "{}",
        err.message()
    );
    assert!(
        script.lock().unwrap().1.is_empty(),
        "no model call for refused launches"
    );
}

/// The edit is in the patch, and the fork's two turns are its tokens and its cost, in the
/// result and in the ledger: the fork's result.
async fn assert_edited_and_paid_exactly(
    gw: &mut Gateway,
    ledger: &mut Ledger,
    run_id: &str,
) -> ForkResult {
    let run = wait_finished(gw, run_id, Duration::from_secs(120)).await;
    assert_eq!(run.state, RunState::Completed as i32, "{run:#?}");
    let fork = fork_result(gw, run_id, 1).await;
    assert_eq!(fork.status, ForkStatus::Succeeded as i32, "{fork:#?}");
    assert!(fork.patch.contains("+four"), "{}", fork.patch);
    let usage = fork.usage.unwrap();
    assert_eq!(
        (
            usage.input_tokens,
            usage.output_tokens,
            usage.cache_read_tokens
        ),
        (2700, 100, 200)
    );
    // claude-haiku-4-5: $1 in, $5 out, $0.10 cache read per million tokens.
    let expected = 2700 + 100 * 5 + 20;
    assert_eq!(fork.cost_micros, expected);
    assert_eq!(fork.agent_output_tail, "Added line four.");
    let account = run_account(ledger, run_id).await;
    assert_eq!(
        account.spent_micros, expected,
        "charged per turn, committed once, exactly"
    );
    assert_eq!(account.reserved_micros, 0);
    fork
}

/// The transcript comes from the runner's artifact store.
fn assert_transcript_of_the_edit(fork: &ForkResult) {
    let lines: Vec<Value> = fork
        .transcript
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.first().unwrap()["type"], "start");
    assert_eq!(lines.first().unwrap()["model"], "claude-haiku-4-5");
    assert!(
        lines
            .iter()
            .any(|l| l["message"]["content"][0]["tool_use_id"] == "toolu_e2e_1")
    );
    assert_eq!(lines.last().unwrap()["type"], "end");
}

/// The model got two requests, the first with the key, the second with the tool's
/// result.
fn assert_model_asked_with_the_key(script: &Script) {
    let requests = script.lock().unwrap().1.clone();
    assert_eq!(requests.len(), 2);
    assert!(requests[0].0.starts_with("POST /v1/messages HTTP/1.1"));
    assert!(
        requests[0]
            .0
            .to_ascii_lowercase()
            .contains(&format!("x-api-key: {}", KEY.to_ascii_lowercase()))
    );
    assert_eq!(
        requests[1].1["messages"][2]["content"][0]["type"],
        "tool_result"
    );
}

/// The key reached the model API and nothing else the mesh wrote.
fn assert_key_in_no_log_or_result(mesh: &Mesh, fork: &ForkResult) {
    for entry in std::fs::read_dir(mesh.state_dir().join("logs"))
        .unwrap()
        .flatten()
    {
        let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
        assert!(!text.contains(KEY), "API key in {}", entry.path().display());
    }
    assert!(!fork.transcript.contains(KEY));
    assert!(!format!("{fork:?}").contains(KEY));
}

/// A budget that runs out mid-conversation: the refused charge stops the agent and the
/// fork is BUDGET_EXCEEDED with what it was charged (3 turns of 1,510 micro-USD).
async fn assert_a_spent_budget_stops_the_agent(
    gw: &mut Gateway,
    ledger: &mut Ledger,
    script: &Script,
    repo_dir: &Path,
) {
    {
        let mut s = script.lock().unwrap();
        s.1.clear();
        for i in 0..6 {
            s.0.push_back(tool_use(
                &format!("toolu_b{i}"),
                "bash",
                json!({"command": format!("echo {i} >> spent.txt")}),
            ));
        }
    }
    let mut req = launch(repo_dir, "anthropic", "haiku");
    req.budget_usd = "0.005".into();
    let run_id = launch_as(gw, req, "llm-budget").await;
    let run = wait_finished(gw, &run_id, Duration::from_secs(120)).await;
    let fork = fork_result(gw, &run_id, 1).await;
    assert_eq!(
        fork.status,
        ForkStatus::BudgetExceeded as i32,
        "{run:#?} {fork:#?}"
    );
    assert_eq!(fork.cost_micros, 3 * 1510, "{fork:#?}");
    assert_eq!(
        script.lock().unwrap().1.len(),
        4,
        "no model call after the refused charge"
    );
    let account = run_account(ledger, &run_id).await;
    assert_eq!(account.spent_micros, 3 * 1510);
    assert_eq!(account.reserved_micros, 0);
    assert!(
        fork.transcript
            .lines()
            .any(|l| l.contains("charge refused")),
        "{}",
        fork.transcript
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_driver_run_through_the_mesh() {
    let script: Script = Arc::default();
    let base = anthropic_server(script.clone()).await;
    script_an_edit(&script);
    let options = MeshOptions {
        env: vec![
            ("ANTHROPIC_API_KEY".into(), KEY.into()),
            ("ANTHROPIC_BASE_URL".into(), base.clone()),
        ],
        ..Default::default()
    };
    let mesh = Mesh::start_with(options).await.expect("mesh");
    let dir = tempfile::tempdir().unwrap();
    let repo_dir = dir.path().join("repo");
    repo::create(&repo_dir).unwrap();
    let mut gw = Gateway::new(mesh.channel("gateway").await.unwrap());

    assert_refused_at_launch(&mut gw, &repo_dir, &script).await;
    let run_id = launch_as(&mut gw, launch(&repo_dir, "anthropic", "haiku"), "llm-e2e").await;
    let mut ledger = Ledger::new(mesh.channel("budget-ledger").await.unwrap());
    let fork = assert_edited_and_paid_exactly(&mut gw, &mut ledger, &run_id).await;
    assert_transcript_of_the_edit(&fork);
    assert_model_asked_with_the_key(&script);
    assert_key_in_no_log_or_result(&mesh, &fork);
    assert_a_spent_budget_stops_the_agent(&mut gw, &mut ledger, &script, &repo_dir).await;
}

fn tool_use(id: &str, name: &str, input: Value) -> (u16, Value) {
    (
        200,
        message(
            "tool_use",
            json!([{"type": "tool_use", "id": id, "name": name, "input": input}]),
            1000,
            100,
        ),
    )
}

use forkyard_common::testing::host_pids_with as pids_with;

/// Turn 1 asks for a file, turn 2's call fails (a 500, the attempt with it), and the
/// retried attempt's call ends the turn.
fn script_a_failed_attempt(script: &Script) {
    let mut s = script.lock().unwrap();
    s.0.push_back(tool_use(
        "toolu_r1",
        "write_file",
        json!({"path": "a.txt", "content": "a\n"}),
    ));
    s.0.push_back((
        500,
        json!({"type": "error", "error": {"type": "api_error", "message": "internal"}}),
    ));
    s.0.push_back((
        200,
        message(
            "end_turn",
            json!([{"type": "text", "text": "ok"}]),
            1000,
            100,
        ),
    ));
}

/// The retried attempt resumed after turn 1: nothing asked or charged twice.
async fn assert_the_retry_resumed(
    gw: &mut Gateway,
    ledger: &mut Ledger,
    script: &Script,
    run_id: &str,
    turn: i64,
) {
    let run = wait_finished(gw, run_id, Duration::from_secs(120)).await;
    assert_eq!(run.state, RunState::Completed as i32, "{run:#?}");
    let fork = fork_result(gw, run_id, 1).await;
    assert_eq!(fork.status, ForkStatus::Succeeded as i32, "{fork:#?}");
    assert!(fork.patch.contains("+a"), "{}", fork.patch);
    assert_eq!(fork.cost_micros, 2 * turn);
    let spent = run_account(ledger, run_id).await.spent_micros;
    assert_eq!(
        spent,
        2 * turn,
        "the retried attempt did not charge turn 1 again"
    );
    let requests = script.lock().unwrap().1.clone();
    assert_eq!(requests.len(), 3, "turn 1 was not asked again");
    let resumed = requests[2].1["messages"].as_array().unwrap();
    assert_eq!(
        resumed.len(),
        3,
        "the conversation resumed after turn 1: {resumed:?}"
    );
    assert_eq!(resumed[2]["content"][0]["tool_use_id"], "toolu_r1");
    assert!(
        fork.transcript
            .lines()
            .any(|l| l.contains("\"type\":\"resume\"")),
        "{}",
        fork.transcript
    );
}

/// Cancel while the agent's command runs: the command dies within seconds, the fork is
/// cancelled, and its one model turn stays spent.
async fn assert_a_cancel_kills_the_command(
    gw: &mut Gateway,
    ledger: &mut Ledger,
    script: &Script,
    repo_dir: &Path,
    turn: i64,
) {
    let marker = format!("{}.{}", 700 + std::process::id() % 200, 17);
    script.lock().unwrap().0.push_back(tool_use(
        "toolu_c1",
        "bash",
        json!({"command": format!("sleep {marker}")}),
    ));
    let run_id = launch_as(gw, launch(repo_dir, "anthropic", "haiku"), "llm-cancel").await;
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while pids_with(&format!("sleep {marker}")).is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "the agent's command never started"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let cancelled = std::time::Instant::now();
    // The sleep would end by itself no sooner than this: the cancel must kill it before
    // (how soon after CancelRun is printed below, not asserted).
    let sleep_ends = cancelled + Duration::from_secs_f64(marker.parse().unwrap());
    gw.cancel_run(forkyard_proto::gateway::v1::CancelRunRequest {
        run_id: run_id.clone(),
        reason: "test".into(),
    })
    .await
    .expect("cancel");
    while !pids_with(&format!("sleep {marker}")).is_empty() {
        assert!(
            std::time::Instant::now() < sleep_ends,
            "the command outlived the cancel"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!(
        "command killed {} ms after CancelRun",
        cancelled.elapsed().as_millis()
    );
    let run = wait_finished(gw, &run_id, Duration::from_secs(60)).await;
    assert_eq!(run.state, RunState::Cancelled as i32, "{run:#?}");
    let fork = fork_result(gw, &run_id, 1).await;
    assert_eq!(fork.status, ForkStatus::Cancelled as i32, "{fork:#?}");
    let spent = run_account(ledger, &run_id).await;
    assert_eq!(spent.spent_micros, turn, "the one model turn stays spent");
    assert_eq!(spent.reserved_micros, 0);
}

/// Temporal retries a failed agent attempt, which resumes from the last heartbeat's
/// details (no turn charged twice); a cancel reaches the agent through its heartbeat and
/// kills its sandbox command within seconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retried_attempts_resume_and_cancels_kill_the_command() {
    let script: Script = Arc::default();
    let base = anthropic_server(script.clone()).await;
    let options = MeshOptions {
        env: vec![
            ("ANTHROPIC_API_KEY".into(), KEY.into()),
            ("ANTHROPIC_BASE_URL".into(), base.clone()),
            // One try per model call: a 500 fails the attempt at once.
            ("FORKYARD_MODEL_RETRIES".into(), "1".into()),
        ],
        ..Default::default()
    };
    let mesh = Mesh::start_with(options).await.expect("mesh");
    let dir = tempfile::tempdir().unwrap();
    let repo_dir = dir.path().join("repo");
    repo::create(&repo_dir).unwrap();
    let mut gw = Gateway::new(mesh.channel("gateway").await.unwrap());
    let mut ledger = Ledger::new(mesh.channel("budget-ledger").await.unwrap());
    let turn = 1000 + 100 * 5 + 10; // haiku, with 100 cache-read tokens

    script_a_failed_attempt(&script);
    let run_id = launch_as(
        &mut gw,
        launch(&repo_dir, "anthropic", "haiku"),
        "llm-retry",
    )
    .await;
    assert_the_retry_resumed(&mut gw, &mut ledger, &script, &run_id, turn).await;
    assert_a_cancel_kills_the_command(&mut gw, &mut ledger, &script, &repo_dir, turn).await;
}
