//! The LLM drivers end to end against local servers speaking the Anthropic and OpenAI
//! wire protocols, with tools running in a real bubblewrap sandbox and charges posted
//! to a real ledger. Here a conversation with each provider and what goes over the
//! wire; how an agent is stopped and resumed is in `llm_stops.rs`.

mod common;

use common::{llm_agent::*, *};
use forkyard_agent_runner::{error::AgentError, llm::LlmError};
use forkyard_proto::agent::v1::RunAgentResponse;
use serde_json::{Value, json};
use std::sync::{Arc, Mutex};

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
    script_an_edit(&script);
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

    assert_anthropic_wire(&script.lock().unwrap().requests);
    assert_beats_carry_progress(&beats, expected);
    let text = assert_transcript_is_the_conversation(&f, &out);

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

/// A 429 and a 529 first (retried with backoff, not turns and not charged), then an
/// edit, a bash call and the end of the turn.
fn script_an_edit(script: &Shared) {
    let mut s = script.lock().unwrap();
    s.replies.push_back((
        429,
        json!({"type": "error", "error": {"type": "rate_limit_error", "message": "slow down"}}),
    ));
    s.replies.push_back((
        529,
        json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}),
    ));
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

/// The wire: headers, model id from the alias, tools, tool_result blocks.
fn assert_anthropic_wire(reqs: &[(axum::http::HeaderMap, Value)]) {
    assert_eq!(reqs.len(), 5);
    for (h, body) in reqs {
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
}

/// Heartbeats carry turns, tokens, cost and the last tool call.
fn assert_beats_carry_progress(beats: &Beats, expected: i64) {
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
}

/// The transcript: JSON lines in the artifact store, the whole conversation; its text.
fn assert_transcript_is_the_conversation(f: &Fixture, out: &RunAgentResponse) -> String {
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
    text
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
