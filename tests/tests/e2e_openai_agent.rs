//! End to end: a run with the `openai` driver through the real mesh. The model is a
//! local server speaking OpenAI chat completions with tool calls (as vLLM and Ollama
//! do); the agent-runner is pointed at it with OPENAI_BASE_URL. A multi-turn, tool-using
//! conversation edits a file in a real sandbox; the fork's result shows the patch,
//! tokens and cost (and the ledger agrees), GetForkResult serves the transcript, and the
//! key is in no log.

mod fake_llm;

use fake_llm::{Requests, api_error};
use forkyard_proto::{
    budget::v1::budget_ledger_client::BudgetLedgerClient,
    common::v1::{AgentSpec, ForkResult, ForkStatus},
    gateway::v1::{LaunchRunRequest, Run, RunState},
};
use forkyard_tests::{
    Mesh,
    mesh::MeshOptions,
    repo,
    support::{Gateway, fork_result, run_account, wait_finished},
};
use serde_json::{Value, json};
use std::{
    path::Path,
    sync::atomic::{AtomicBool, Ordering},
    time::Duration,
};

const KEY: &str = "sk-openai-e2e-SECRET-8282";

/// A chat completion that calls one tool.
fn tool_call(id: &str, name: &str, args: Value, prompt: u64, cached: u64, out: u64) -> Value {
    json!({"id": format!("chatcmpl-{id}"), "object": "chat.completion", "model": "gpt-4o",
        "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {"role": "assistant",
            "content": null, "tool_calls": [{"id": id, "type": "function",
                "function": {"name": name, "arguments": args.to_string()}}]}}],
        "usage": {"prompt_tokens": prompt, "completion_tokens": out, "total_tokens": prompt + out,
                  "prompt_tokens_details": {"cached_tokens": cached}}})
}

/// The model: read the file, edit it, say so; a 429 first (retried, not a turn).
fn model(rate_limited: &AtomicBool, body: &Value) -> (u16, Value) {
    if !rate_limited.swap(true, Ordering::SeqCst) {
        return (
            429,
            api_error("rate_limit_exceeded", "Rate limit reached for gpt-4o"),
        );
    }
    // system, user, then an assistant message and a tool result per turn.
    match body["messages"].as_array().map_or(0, Vec::len) {
        2 => (
            200,
            tool_call(
                "call_e2e_1",
                "read_file",
                json!({"path": "src/lib.txt"}),
                1000,
                400,
                50,
            ),
        ),
        4 => (
            200,
            tool_call(
                "call_e2e_2",
                "edit",
                json!({"path": "src/lib.txt", "old_string": "three\n", "new_string": "three\nfour\n"}),
                1500,
                1000,
                80,
            ),
        ),
        _ => (
            200,
            json!({"id": "chatcmpl-3", "object": "chat.completion", "model": "gpt-4o",
                "choices": [{"index": 0, "finish_reason": "stop",
                    "message": {"role": "assistant", "content": "Added line four."}}],
                "usage": {"prompt_tokens": 2000, "completion_tokens": 20, "total_tokens": 2020,
                          "prompt_tokens_details": {"cached_tokens": 1500}}}),
        ),
    }
}

/// One fork of the openai driver with gpt-4o: its run's id.
async fn launch_one_fork(gw: &mut Gateway, repo_dir: &Path) -> String {
    gw.launch_run(LaunchRunRequest {
        repo: repo_dir.to_string_lossy().into_owned(),
        prompt: "Append a line four to src/lib.txt".into(),
        forks: 1,
        max_concurrent: 1,
        budget_usd: "1".into(),
        agent: Some(AgentSpec {
            driver: "openai".into(),
            model: "gpt-4o".into(),
            ..Default::default()
        }),
        fork_timeout_secs: 120,
        request_id: "openai-e2e".into(),
        ..Default::default()
    })
    .await
    .expect("launch")
    .into_inner()
    .run_id
}

/// The fork's three turns are its tokens and its cost, in the result, the run and the
/// ledger.
async fn assert_paid_exactly(mesh: &Mesh, run_id: &str, run: &Run, fork: &ForkResult) {
    // prompt_tokens include the cached ones, priced apart.
    let usage = fork.usage.unwrap();
    assert_eq!(
        (
            usage.input_tokens,
            usage.cache_read_tokens,
            usage.output_tokens
        ),
        (1600, 2900, 150)
    );
    // gpt-4o: $2.50 in, $1.25 cached, $10 out per million tokens; per turn
    // 1500+500+500, 1250+1250+800, 1250+1875+200.
    let expected = 2500 + 3300 + 3325;
    assert_eq!(fork.cost_micros, expected);
    assert_eq!(run.cost_micros, expected);
    let mut ledger = BudgetLedgerClient::new(mesh.channel("budget-ledger").await.unwrap());
    let account = run_account(&mut ledger, run_id).await;
    assert_eq!(
        account.spent_micros, expected,
        "charged per turn, committed once, exactly"
    );
    assert_eq!(account.reserved_micros, 0);
}

/// The transcript, from the runner's artifact store: the whole conversation.
fn assert_transcript_is_the_conversation(fork: &ForkResult) {
    let lines: Vec<Value> = fork
        .transcript
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.first().unwrap()["type"], "start");
    assert_eq!(lines.first().unwrap()["driver"], "openai");
    assert_eq!(lines.first().unwrap()["model"], "gpt-4o");
    let tool_results: Vec<&Value> = lines
        .iter()
        .filter(|l| l["type"] == "message" && l["message"]["role"] == "tool")
        .map(|l| &l["message"])
        .collect();
    assert_eq!(tool_results.len(), 2, "{}", fork.transcript);
    assert_eq!(tool_results[1]["tool_call_id"], "call_e2e_2");
    assert_eq!(
        lines.iter().filter(|l| l["type"] == "usage").count(),
        3,
        "three model turns"
    );
    assert_eq!(lines.last().unwrap()["type"], "end");
}

/// The wire: chat completions with the key as a bearer token, the tools as functions,
/// and the tool results handed back.
fn assert_the_wire(requests: &Requests) {
    let reqs = requests.lock().unwrap().clone();
    assert_eq!(reqs.len(), 4, "a 429, then three turns");
    for (head, body) in &reqs {
        assert!(
            head.starts_with("POST /v1/chat/completions HTTP/1.1"),
            "{head}"
        );
        assert!(
            head.to_ascii_lowercase().contains(&format!(
                "authorization: bearer {}",
                KEY.to_ascii_lowercase()
            )),
            "{head}"
        );
        assert_eq!(body["model"], "gpt-4o");
        assert_eq!(body["tools"][0]["type"], "function");
        let names: Vec<&str> = body["tools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["function"]["name"].as_str().unwrap())
            .collect();
        assert_eq!(
            names,
            ["bash", "read_file", "write_file", "edit", "list_files"]
        );
    }
    let third = reqs[2].1["messages"].as_array().unwrap();
    assert_eq!(third[2]["tool_calls"][0]["id"], "call_e2e_1");
    assert_eq!(third[3]["role"], "tool");
    assert_eq!(third[3]["tool_call_id"], "call_e2e_1");
    assert!(
        third[3]["content"]
            .as_str()
            .unwrap()
            .contains("one\ntwo\nthree"),
        "the file's content went back to the model: {}",
        third[3]
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_driver_run_through_the_mesh() {
    let requests = Requests::default();
    let rate_limited = AtomicBool::new(false);
    let base = fake_llm::serve(move |_, body| model(&rate_limited, body), requests.clone()).await;
    let options = MeshOptions {
        env: vec![
            ("OPENAI_API_KEY".into(), KEY.into()),
            ("OPENAI_BASE_URL".into(), format!("{base}/v1")),
        ],
        ..Default::default()
    };
    let mesh = Mesh::start_with(options).await.expect("mesh");
    let dir = tempfile::tempdir().unwrap();
    let repo_dir = dir.path().join("repo");
    repo::create(&repo_dir).unwrap();
    let mut gw = Gateway::new(mesh.channel("gateway").await.unwrap());

    let run_id = launch_one_fork(&mut gw, &repo_dir).await;
    let run = wait_finished(&mut gw, &run_id, Duration::from_secs(120)).await;
    assert_eq!(run.state, RunState::Completed as i32, "{run:#?}");
    let fork = fork_result(&mut gw, &run_id, 1).await;
    assert_eq!(fork.status, ForkStatus::Succeeded as i32, "{fork:#?}");
    assert!(fork.patch.contains("+four"), "{}", fork.patch);
    assert_eq!(fork.agent_output_tail, "Added line four.");
    assert_paid_exactly(&mesh, &run_id, &run, &fork).await;
    assert_transcript_is_the_conversation(&fork);
    assert_the_wire(&requests);
    assert_key_in_no_log_or_result(&mesh, &fork);
}
