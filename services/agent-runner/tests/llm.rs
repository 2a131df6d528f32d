//! The LLM drivers end to end against local servers speaking the Anthropic and OpenAI
//! wire protocols, with tools running in a real bubblewrap sandbox and charges posted
//! to a real ledger.

mod common;

use common::*;
use forkyard_agent_runner::{error::AgentError, llm::LlmError};
use forkyard_proto::{
    agent::v1::{AgentProgress, RunAgentRequest, RunAgentResponse},
    budget::v1::budget_ledger_client::BudgetLedgerClient,
    common::v1::AgentSpec,
    sandbox::v1::ReadFileRequest,
};
use serde_json::{Value, json};
use std::{
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

fn request(
    f: &Fixture,
    run_id: &str,
    driver: &str,
    model: &str,
    reservation: &str,
) -> RunAgentRequest {
    RunAgentRequest {
        run_id: run_id.into(),
        fork: 1,
        sandbox_id: f.sandbox_id.clone(),
        agent: Some(AgentSpec {
            driver: driver.into(),
            model: model.into(),
            ..Default::default()
        }),
        prompt: "Say hi instead of hello in README.md".into(),
        timeout_secs: 120,
        reservation_id: reservation.into(),
        charge_key: format!("{run_id}/fork-1/a1/agent"),
        attempt: 1,
        ..Default::default()
    }
}

/// Run the Anthropic driver (sonnet) for fork 1 of `run` on `reservation`, as attempt 1:
/// what it returned and the heartbeats it sent.
async fn run_anthropic(
    f: &Fixture,
    run: &str,
    reservation: &str,
) -> (Result<RunAgentResponse, AgentError>, Beats) {
    let beats = Beats::default();
    let out = f
        .runner
        .run(
            &request(f, run, "anthropic", "sonnet", reservation),
            &beats,
            std::future::pending(),
            None,
            1,
        )
        .await;
    (out, beats)
}

fn tool_use(id: &str, name: &str, input: Value, usage: Value) -> (u16, Value) {
    (
        200,
        json!({"id": format!("msg_{id}"), "type": "message", "role": "assistant",
        "model": "claude-sonnet-4-5", "stop_reason": "tool_use",
        "content": [{"type": "text", "text": "Let me do that."},
                    {"type": "tool_use", "id": id, "name": name, "input": input}],
        "usage": usage}),
    )
}

fn end_turn(text: &str, usage: Value) -> (u16, Value) {
    (
        200,
        json!({"id": "msg_end", "type": "message", "role": "assistant",
        "model": "claude-sonnet-4-5", "stop_reason": "end_turn",
        "content": [{"type": "text", "text": text}], "usage": usage}),
    )
}

async fn read(f: &mut Fixture, path: &str) -> String {
    let r = f
        .provisioner
        .read_file(ReadFileRequest {
            sandbox_id: f.sandbox_id.clone(),
            path: path.into(),
            max_bytes: 0,
        })
        .await
        .unwrap()
        .into_inner();
    String::from_utf8(r.content).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_agent_edits_a_file_over_several_turns_and_charges_each_turn() {
    let logs = LogBuf::default();
    let w = logs.clone();
    let _ = tracing_subscriber::fmt()
        .with_writer(move || w.clone())
        .with_ansi(false)
        .try_init();

    let script: Shared = Arc::default();
    let base = model_server(script.clone()).await;
    let mut f = fixture(&base).await;
    let run = "run-anthropic";
    let rsv = f.reservation(run, 1_000_000, 100_000).await;
    {
        let mut s = script.lock().unwrap();
        // A 429 and a 529 first: retried with backoff, not turns and not charged.
        s.replies.push_back((
            429,
            json!({"type": "error", "error": {"type": "rate_limit_error", "message": "slow down"}}),
        ));
        s.replies.push_back((529, json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}})));
        s.replies.push_back(tool_use(
            "toolu_1",
            "edit",
            json!({"path": "README.md", "old_string": "hello", "new_string": "hi"}),
            a_usage(1000, 100),
        ));
        s.replies.push_back(tool_use(
            "toolu_2",
            "bash",
            json!({"command": "cat README.md && echo done > notes.txt"}),
            a_usage(2000, 50),
        ));
        s.replies
            .push_back(end_turn("README now says hi.", a_usage(3000, 20)));
    }
    let (result, beats) = run_anthropic(&f, run, &rsv).await;
    let out = result.expect("agent run");

    assert_eq!(out.exit_code, 0);
    assert!(!out.timed_out);
    assert_eq!(out.turns, 3);
    assert_eq!(out.output_tail, "README now says hi.");
    let usage = out.usage.unwrap();
    assert_eq!((usage.input_tokens, usage.output_tokens), (6000, 170));
    // claude-sonnet-4-5: $3 in / $15 out per million tokens.
    let expected = 6000 * 3 + 170 * 15;
    assert_eq!(out.cost_micros, expected);
    assert_eq!(
        f.charged(run).await,
        expected,
        "every turn charged once, to the micro"
    );
    assert_eq!(read(&mut f, "README.md").await, "hi world\n");
    assert_eq!(read(&mut f, "notes.txt").await, "done\n");

    // The wire: headers, model id from the alias, tools, tool_result blocks.
    let reqs = script.lock().unwrap().requests.clone();
    assert_eq!(reqs.len(), 5);
    for (h, body) in &reqs {
        assert_eq!(h["x-api-key"], KEY);
        assert_eq!(h["anthropic-version"], "2023-06-01");
        assert!(h.get("authorization").is_none());
        assert_eq!(body["model"], "claude-sonnet-4-5");
        assert!(body["max_tokens"].as_u64().unwrap() > 0);
        assert!(body["system"].is_string());
        let names: Vec<&str> = body["tools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["name"].as_str().unwrap())
            .collect();
        assert_eq!(
            names,
            ["bash", "read_file", "write_file", "edit", "list_files"]
        );
        assert!(body["tools"][0]["input_schema"]["properties"]["command"].is_object());
    }
    let second = &reqs[3].1["messages"];
    assert_eq!(second.as_array().unwrap().len(), 3);
    assert_eq!(second[1]["role"], "assistant");
    assert_eq!(second[1]["content"][1]["type"], "tool_use");
    assert_eq!(second[2]["role"], "user");
    let result = &second[2]["content"][0];
    assert_eq!(result["type"], "tool_result");
    assert_eq!(result["tool_use_id"], "toolu_1");
    assert_eq!(result["is_error"], false);
    let bash_result = &reqs[4].1["messages"][4]["content"][0];
    assert_eq!(bash_result["tool_use_id"], "toolu_2");
    assert!(
        bash_result["content"]
            .as_str()
            .unwrap()
            .contains("hi world"),
        "{bash_result}"
    );

    // Heartbeats carry turns, tokens, cost and the last tool call.
    let last = beats.last();
    assert_eq!(last.turns, 3);
    assert_eq!(last.cost_micros, expected);
    assert_eq!(last.charged_micros, expected);
    assert_eq!(last.usage.unwrap().input_tokens, 6000);
    assert!(
        last.last_tool.starts_with("bash: cat README.md"),
        "{}",
        last.last_tool
    );

    // The transcript: JSON lines in the artifact store, the whole conversation.
    let text = std::fs::read_to_string(f.artifacts.join(&out.transcript_key)).unwrap();
    assert_eq!(out.transcript_key, "run-anthropic/fork-1/attempt-1.jsonl");
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines[0]["type"], "start");
    assert_eq!(lines.iter().filter(|l| l["type"] == "usage").count(), 3);
    assert!(
        lines
            .iter()
            .any(|l| l["type"] == "message" && l["message"]["content"][0]["type"] == "tool_result")
    );
    assert_eq!(lines.last().unwrap()["type"], "end");

    // The key reached the model API only.
    let logged = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
    assert!(
        logged.contains("retrying"),
        "the 429/529 retries are logged"
    );
    for (what, text) in [
        ("transcript", text),
        ("heartbeats", beats.all_json()),
        ("logs", logged),
        ("response", format!("{out:?}")),
    ] {
        assert!(!text.contains(KEY), "API key leaked into the {what}");
    }
    let env = f
        .provisioner
        .exec(forkyard_proto::sandbox::v1::ExecRequest {
            sandbox_id: f.sandbox_id.clone(),
            argv: vec!["env".into()],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(
        !env.stdout.contains(KEY),
        "API key in the sandbox environment"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_agent_uses_tool_calls_against_a_compatible_server() {
    let script: Shared = Arc::default();
    let base = model_server(script.clone()).await;
    let mut f = fixture(&base).await;
    let run = "run-openai";
    let rsv = f.reservation(run, 1_000_000, 100_000).await;
    let call = |id: &str, name: &str, args: Value| {
        json!({"id": "chatcmpl-1", "object": "chat.completion",
        "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {"role": "assistant", "content": null,
            "tool_calls": [{"id": id, "type": "function", "function": {"name": name, "arguments": args.to_string()}}]}}],
        "usage": {"prompt_tokens": 1000, "completion_tokens": 100, "total_tokens": 1100,
                  "prompt_tokens_details": {"cached_tokens": 400}}})
    };
    {
        let mut s = script.lock().unwrap();
        s.replies.push_back((
            200,
            call(
                "call_1",
                "write_file",
                json!({"path": "src/new.txt", "content": "fresh\n"}),
            ),
        ));
        s.replies
            .push_back((200, call("call_2", "list_files", json!({}))));
        s.replies.push_back((200, json!({"id": "chatcmpl-3", "object": "chat.completion",
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "Added src/new.txt."}}],
            "usage": {"prompt_tokens": 500, "completion_tokens": 10, "total_tokens": 510}})));
    }
    let beats = Beats::default();
    let out = f
        .runner
        .run(
            &request(&f, run, "openai", "gpt-4o", &rsv),
            &beats,
            std::future::pending(),
            None,
            1,
        )
        .await
        .expect("agent run");
    assert_eq!((out.exit_code, out.turns), (0, 3));
    assert_eq!(read(&mut f, "src/new.txt").await, "fresh\n");
    let u = out.usage.unwrap();
    // prompt_tokens include the cached ones, which are priced apart.
    assert_eq!(
        (u.input_tokens, u.cache_read_tokens, u.output_tokens),
        (1700, 800, 210)
    );
    // gpt-4o: $2.5 in, $1.25 cached, $10 out per million.
    let expected = (1700.0f64 * 2.5 + 800.0 * 1.25 + 210.0 * 10.0).ceil() as i64;
    assert_eq!(out.cost_micros, expected);
    assert_eq!(f.charged(run).await, expected);

    let reqs = script.lock().unwrap().requests.clone();
    for (h, body) in &reqs {
        assert_eq!(h["authorization"], format!("Bearer {OPENAI_KEY}"));
        assert_eq!(body["model"], "gpt-4o");
        assert_eq!(body["tools"][0]["type"], "function");
        assert_eq!(body["tools"][0]["function"]["name"], "bash");
        assert!(body["tools"][0]["function"]["parameters"].is_object());
    }
    let msgs = reqs[2].1["messages"].as_array().unwrap().clone();
    assert_eq!(msgs[0]["role"], "system");
    assert_eq!(msgs[2]["tool_calls"][0]["id"], "call_1");
    assert_eq!(msgs[3]["role"], "tool");
    assert_eq!(msgs[3]["tool_call_id"], "call_1");
    assert_eq!(msgs[5]["tool_call_id"], "call_2");
    assert!(
        msgs[5]["content"].as_str().unwrap().contains("src/new.txt"),
        "{}",
        msgs[5]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_charge_stops_the_agent_as_budget_exceeded() {
    let script: Shared = Arc::default();
    let base = model_server(script.clone()).await;
    let mut f = fixture(&base).await;
    let run = "run-budget";
    // Each turn costs 4,500 micro-USD; the run has 6,000.
    let rsv = f.reservation(run, 6_000, 4_000).await;
    {
        let mut s = script.lock().unwrap();
        for i in 0..5 {
            s.replies.push_back(tool_use(
                &format!("toolu_{i}"),
                "bash",
                json!({"command": format!("echo {i} >> log.txt")}),
                a_usage(1000, 100),
            ));
        }
    }
    let (result, _) = run_anthropic(&f, run, &rsv).await;
    let err = result.unwrap_err();
    assert!(matches!(err, AgentError::BudgetExceeded(_)), "{err:?}");
    assert!(
        err.to_string()
            .contains("stopped after 1 turns (4500 micro-USD charged"),
        "{err}"
    );
    // Final for Temporal: the activity failure is non-retryable BudgetExceeded.
    let act = format!("{:?}", err_to_activity(err));
    assert!(
        act.contains("BudgetExceeded") && act.contains("non_retryable: true"),
        "{act}"
    );
    assert_eq!(
        script.lock().unwrap().requests.len(),
        2,
        "no model call after the refusal"
    );
    assert_eq!(
        f.charged(run).await,
        4_500,
        "only the first turn was charged"
    );
    assert_eq!(
        read(&mut f, "log.txt").await,
        "0\n",
        "the second turn's tools never ran"
    );
}

fn err_to_activity(e: AgentError) -> temporalio_sdk::activities::ActivityError {
    e.into_activity()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancellation_mid_conversation_kills_the_sandbox_command() {
    let script: Shared = Arc::default();
    let base = model_server(script.clone()).await;
    let mut f = fixture(&base).await;
    let run = "run-cancel";
    let rsv = f.reservation(run, 1_000_000, 100_000).await;
    let marker = format!(
        "{}.{}",
        500 + std::process::id() % 400,
        Instant::now().elapsed().subsec_nanos() % 1000 + 1
    );
    {
        let mut s = script.lock().unwrap();
        s.replies.push_back(tool_use(
            "toolu_1",
            "bash",
            json!({"command": "echo ok"}),
            a_usage(10, 10),
        ));
        s.replies.push_back(tool_use(
            "toolu_2",
            "bash",
            json!({"command": format!("sleep {marker}")}),
            a_usage(10, 10),
        ));
    }
    let beats = Beats::default();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let req = request(&f, run, "anthropic", "sonnet", &rsv);
    let runner = f.runner.clone();
    let b = beats.clone();
    let task = tokio::spawn(async move {
        runner
            .run(
                &req,
                &b,
                async {
                    let _ = rx.await;
                },
                None,
                1,
            )
            .await
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    while host_pids_with(&format!("sleep {marker}")).is_empty() {
        assert!(Instant::now() < deadline, "the sleep never started");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(beats.last().turns, 2);
    let cancelled_at = Instant::now();
    tx.send(()).unwrap();
    let res = tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .expect("stops within seconds")
        .unwrap();
    assert!(matches!(res, Err(AgentError::Cancelled)), "{res:?}");
    while !host_pids_with(&format!("sleep {marker}")).is_empty() {
        assert!(
            cancelled_at.elapsed() < Duration::from_secs(5),
            "the sandbox command outlived the cancel"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(script.lock().unwrap().requests.len(), 2);
    assert_eq!(f.charged(run).await, 2 * (10 * 3 + 10 * 15));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_attempt_resumes_without_charging_again() {
    let script: Shared = Arc::default();
    let base = model_server(script.clone()).await;
    let mut f = fixture(&base).await;
    let run = "run-retry";
    let rsv = f.reservation(run, 1_000_000, 100_000).await;
    {
        let mut s = script.lock().unwrap();
        s.replies.push_back(tool_use(
            "toolu_1",
            "write_file",
            json!({"path": "a.txt", "content": "a\n"}),
            a_usage(1000, 100),
        ));
        // Then the API stays down past the runner's retries: the attempt fails (retryable).
        for _ in 0..3 {
            s.replies.push_back((
                500,
                json!({"type": "error", "error": {"type": "api_error", "message": "boom"}}),
            ));
        }
    }
    let beats = Beats::default();
    let req = request(&f, run, "anthropic", "sonnet", &rsv);
    let err = f
        .runner
        .run(&req, &beats, std::future::pending(), None, 1)
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            AgentError::Model(LlmError::Unavailable {
                status: 500,
                attempts: 3,
                ..
            })
        ),
        "{err:?}"
    );
    let act = format!("{:?}", err.into_activity());
    assert!(
        act.contains("ModelUnavailable") && act.contains("non_retryable: false"),
        "{act}"
    );
    assert_eq!(f.charged(run).await, 4_500);
    let heartbeat: AgentProgress = beats.last();
    assert_eq!((heartbeat.turns, heartbeat.charged_micros), (1, 4_500));

    // Attempt 2 starts from attempt 1's last heartbeat.
    script
        .lock()
        .unwrap()
        .replies
        .push_back(end_turn("done", a_usage(2000, 10)));
    let beats2 = Beats::default();
    let out = f
        .runner
        .run(&req, &beats2, std::future::pending(), Some(heartbeat), 2)
        .await
        .expect("retry");
    assert_eq!(out.turns, 2);
    let second_turn = 2000 * 3 + 10 * 15;
    assert_eq!(out.cost_micros, 4_500 + second_turn);
    assert_eq!(
        f.charged(run).await,
        4_500 + second_turn,
        "turn 1 is not charged twice"
    );
    // The conversation continued where it stopped: prompt, tool_use, tool_result.
    let reqs = script.lock().unwrap().requests.clone();
    let resumed = reqs.last().unwrap().1["messages"]
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(resumed.len(), 3, "{resumed:?}");
    assert_eq!(resumed[2]["content"][0]["tool_use_id"], "toolu_1");

    // Replaying a charge key posts nothing: the same turn charged again is a no-op.
    let mut charger = forkyard_agent_runner::charge::Charger {
        client: BudgetLedgerClient::new(forkyard_common::grpc_telemetry::traced_channel(
            f.runner.ledger.clone(),
        )),
        reservation_id: rsv.clone(),
        key_prefix: req.charge_key.clone(),
        run_id: run.into(),
        fork: 1,
        model: "claude-sonnet-4-5".into(),
        activity_attempt: 2,
    };
    charger.charge(1, 4_500).await.unwrap();
    assert_eq!(f.charged(run).await, 4_500 + second_turn);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_401_is_final_and_names_no_key() {
    let script: Shared = Arc::default();
    let base = model_server(script.clone()).await;
    let f = fixture(&base).await;
    script.lock().unwrap().replies.push_back((401, json!({"type": "error", "error": {"type": "authentication_error", "message": format!("invalid x-api-key {KEY}")}})));
    let req = request(&f, "run-401", "anthropic", "sonnet", "");
    let err = f
        .runner
        .run(&req, &Beats::default(), std::future::pending(), None, 1)
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            AgentError::Model(LlmError::Rejected { status: 401, .. })
        ),
        "{err:?}"
    );
    assert_eq!(
        script.lock().unwrap().requests.len(),
        1,
        "401 is not retried"
    );
    assert!(!err.to_string().contains(KEY), "{err}");
    let act = format!("{:?}", err.into_activity());
    assert!(act.contains("non_retryable: true"), "{act}");
    let _ = Mutex::new(());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ledger_outage_does_not_stop_the_agent_and_its_cost_is_reported_in_full() {
    let script: Shared = Arc::default();
    let base = model_server(script.clone()).await;
    let mut f = fixture(&base).await;
    let run = "run-ledger-away";
    let rsv = f.reservation(run, 1_000_000, 100_000).await;
    // The ledger goes away after the reservation: every charge is refused connection.
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", l.local_addr().unwrap())
    };
    f.runner.ledger = forkyard_agent_runner::runner::short_call_channel("ledger", &closed).unwrap();
    {
        let mut s = script.lock().unwrap();
        s.replies.push_back(tool_use(
            "toolu_1",
            "bash",
            json!({"command": "echo one >> log.txt"}),
            a_usage(1000, 100),
        ));
        s.replies.push_back(end_turn("Done.", a_usage(1000, 100)));
    }
    let (result, _) = run_anthropic(&f, run, &rsv).await;
    let out = result.expect("the agent finishes although no turn could be charged");
    assert_eq!(out.exit_code, 0);
    assert_eq!(read(&mut f, "log.txt").await, "one\n");
    assert_eq!(out.turns, 2);
    assert_eq!(
        out.cost_micros, 9_000,
        "the whole cost is reported, for the fork's commit to post"
    );
    assert_eq!(f.charged(run).await, 0, "nothing reached the ledger");
    let transcript = std::fs::read_to_string(f.artifacts.join(&out.transcript_key)).unwrap();
    assert_eq!(
        transcript.matches("charge_deferred").count(),
        2,
        "{transcript}"
    );
}
