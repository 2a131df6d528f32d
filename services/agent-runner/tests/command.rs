//! The `command` driver with agent CLIs that stream usage: fake `claude -p
//! --output-format stream-json --verbose` and `codex exec --json` shell scripts run in a
//! real bubblewrap sandbox and print the real formats; charges go to a real ledger.

mod common;

use common::*;
use forkyard_agent_runner::error::AgentError;
use forkyard_proto::{
    agent::v1::{AgentProgress, RunAgentRequest},
    common::v1::AgentSpec,
    sandbox::v1::WriteFileRequest,
};
use serde_json::{Value, json};
use std::time::{Duration, Instant};

/// A Claude Code assistant line: one content block of message `id`.
fn assistant(id: &str, block: Value, input: u64, output: u64) -> String {
    json!({"type": "assistant", "message": {"id": id, "type": "message", "role": "assistant",
        "model": "claude-sonnet-4-5", "content": [block], "stop_reason": null,
        "usage": {"input_tokens": input, "cache_creation_input_tokens": 0,
                  "cache_read_input_tokens": 0, "output_tokens": output}},
        "parent_tool_use_id": null, "session_id": "sess-1"})
    .to_string()
}

fn text(t: &str) -> Value {
    json!({"type": "text", "text": t})
}

/// `sh` that prints `line` (single-quoted).
fn emit(line: &str) -> String {
    format!("printf '%s\\n' '{}'\n", line.replace('\'', r"'\''"))
}

async fn put(f: &mut Fixture, path: &str, content: &str) {
    f.provisioner
        .write_file(WriteFileRequest {
            sandbox_id: f.sandbox_id.clone(),
            path: path.into(),
            content: content.as_bytes().to_vec(),
            mode: 0o755,
        })
        .await
        .expect("write into the sandbox");
}

fn request(f: &Fixture, run_id: &str, command: &str, reservation: &str) -> RunAgentRequest {
    RunAgentRequest {
        run_id: run_id.into(),
        fork: 1,
        sandbox_id: f.sandbox_id.clone(),
        agent: Some(AgentSpec {
            driver: "command".into(),
            command: command.into(),
            ..Default::default()
        }),
        prompt: "Say hi".into(),
        timeout_secs: 120,
        reservation_id: reservation.into(),
        charge_key: format!("{run_id}/fork-1/a1/agent"),
        attempt: 1,
        ..Default::default()
    }
}

async fn wait_for(what: &str, mut ok: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !ok().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

// claude-sonnet-4-5: $3 in, $15 out per million tokens.
const TURN_1: i64 = 1000 * 3 + 100 * 15; // 4,500
const TURN_2: i64 = 2000 * 3 + 50 * 15; // 6,750

/// A fake `claude -p --output-format stream-json --verbose`: message 1 (a text and a
/// tool_use block, each line repeating the message's usage), waits for `.go`, message 2,
/// then the result line with the CLI's own price (`total_cost_usd`) and total usage.
fn claude_stream(total_cost_usd: &str) -> String {
    let mut s = String::from("#!/bin/sh\n");
    s += &emit(
        r#"{"type":"system","subtype":"init","session_id":"sess-1","model":"claude-sonnet-4-5","tools":["Bash","Edit"]}"#,
    );
    s += &emit(&assistant("msg_01", text("Editing README."), 1000, 100));
    s += &emit(&assistant(
        "msg_01",
        json!({"type": "tool_use", "id": "toolu_01", "name": "Bash", "input": {"command": "echo hi > README.md"}}),
        1000,
        100,
    ));
    s += "echo hi > README.md\n";
    s += &emit(
        r#"{"type":"user","message":{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_01","content":""}]},"parent_tool_use_id":null,"session_id":"sess-1"}"#,
    );
    s += "while [ ! -f .go ]; do sleep 0.05; done\n";
    s += &emit(&assistant("msg_02", text("Done."), 2000, 50));
    s += &emit(&format!(
        r#"{{"type":"result","subtype":"success","is_error":false,"num_turns":2,"result":"Done.","session_id":"sess-1","total_cost_usd":{total_cost_usd},"usage":{{"input_tokens":3000,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":150}}}}"#
    ));
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamed_usage_is_charged_while_the_command_runs_and_reconciled_at_the_end() {
    let mut f = fixture("http://127.0.0.1:1").await;
    let run = "run-stream";
    let rsv = f.reservation(run, 1_000_000, 100_000).await;
    // The CLI's own total is $0.012: 750 micro-USD above what its turns priced at.
    put(&mut f, "fake-claude", &claude_stream("0.012")).await;
    let req = request(
        &f,
        run,
        "sh fake-claude -p --output-format stream-json --verbose",
        &rsv,
    );
    let beats = Beats::default();
    let (runner, b) = (f.runner.clone(), beats.clone());
    let task =
        tokio::spawn(async move { runner.run(&req, &b, std::future::pending(), None, 1).await });

    // Message 1 is charged once (its two lines repeat one usage) while the CLI still runs.
    let mut ledger = f.ledger.clone();
    wait_for("the first charge", async || {
        spent(&mut ledger, run).await == TURN_1
    })
    .await;
    wait_for("a heartbeat with the first turn", async || {
        beats.last().turns == 1
    })
    .await;
    assert!(!task.is_finished(), "the command is still running");
    let beat = beats.last();
    assert_eq!((beat.cost_micros, beat.charged_micros), (TURN_1, TURN_1));
    let u = beat.usage.unwrap();
    assert_eq!((u.input_tokens, u.output_tokens), (1000, 100));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        f.charged(run).await,
        TURN_1,
        "no charge twice for message 1"
    );

    put(&mut f, ".go", "").await;
    let out = tokio::time::timeout(Duration::from_secs(30), task)
        .await
        .expect("the command finishes")
        .unwrap()
        .expect("agent run");
    assert_eq!(out.exit_code, 0, "{}", out.output_tail);
    assert_eq!(out.turns, 2);
    assert_eq!(out.cost_micros, 12_000, "the CLI's own total");
    assert_eq!(
        f.charged(run).await,
        TURN_1 + TURN_2,
        "each message charged as it came, once"
    );
    let u = out.usage.unwrap();
    assert_eq!((u.input_tokens, u.output_tokens), (3000, 150));
    assert!(out.output_tail.contains("\"type\":\"result\""));
    let last = beats.last();
    assert_eq!((last.turns, last.charged_micros), (2, TURN_1 + TURN_2));
    // The fork's Commit of the result's cost posts only the rest of the CLI's total.
    commit(&mut f, &rsv, out.cost_micros).await;
    assert_eq!(
        f.charged(run).await,
        12_000,
        "the ledger matches the result"
    );

    // The transcript: every event the CLI printed, the charges, the reconciliation.
    assert_eq!(out.transcript_key, "run-stream/fork-1/attempt-1.jsonl");
    assert_eq!(out.transcript_endpoint, "http://runner-under-test:50053");
    let lines: Vec<Value> = std::fs::read_to_string(f.artifacts.join(&out.transcript_key))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines[0]["type"], "start");
    assert_eq!(lines[0]["driver"], "command");
    let usage: Vec<i64> = lines
        .iter()
        .filter(|l| l["type"] == "usage")
        .map(|l| l["cost_micros"].as_i64().unwrap())
        .collect();
    assert_eq!(usage, [TURN_1, TURN_2]);
    assert!(
        lines
            .iter()
            .any(|l| l["event"]["message"]["content"][0]["id"] == "toolu_01")
    );
    let total = lines.iter().find(|l| l["type"] == "total").unwrap();
    assert_eq!(total["left_to_commit_micros"], 750);
    assert_eq!(lines.last().unwrap()["type"], "end");
}

/// What the fork workflow does when the agent returns: commit the result's cost.
async fn commit(f: &mut Fixture, reservation: &str, amount: i64) {
    f.ledger
        .commit(forkyard_proto::budget::v1::CommitRequest {
            reservation_id: reservation.into(),
            amount_micros: amount,
            idempotency_key: format!("{reservation}/commit"),
        })
        .await
        .expect("commit");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_charge_mid_stream_kills_the_command() {
    let mut f = fixture("http://127.0.0.1:1").await;
    let run = "run-stream-budget";
    // Each message costs 4,500 micro-USD; the run has 6,000.
    let rsv = f.reservation(run, 6_000, 4_000).await;
    let marker = format!("{}.{}", 300 + std::process::id() % 400, 31);
    let mut script = String::from("#!/bin/sh\n");
    script += &emit(&assistant("msg_01", text("one"), 1000, 100));
    script += &emit(&assistant("msg_02", text("two"), 1000, 100));
    script += &format!("sleep {marker}\necho after > after.txt\n");
    put(&mut f, "fake-claude", &script).await;
    let req = request(&f, run, "sh fake-claude", &rsv);
    let (runner, beats) = (f.runner.clone(), Beats::default());
    let b = beats.clone();
    // The command's sleep ends by itself no sooner than this: the refusal must stop it
    // before then (how soon is no target of a test).
    let sleep_ends = Instant::now() + Duration::from_secs_f64(marker.parse().unwrap());
    let task =
        tokio::spawn(async move { runner.run(&req, &b, std::future::pending(), None, 1).await });
    let err = tokio::time::timeout_at(sleep_ends.into(), task)
        .await
        .expect("stops at the refusal, not after the sleep")
        .unwrap()
        .unwrap_err();
    assert!(matches!(err, AgentError::BudgetExceeded(_)), "{err:?}");
    assert!(
        err.to_string()
            .contains("stopped after 1 usage reports (4500 micro-USD charged"),
        "{err}"
    );
    let act = format!("{:?}", err.into_activity());
    assert!(
        act.contains("BudgetExceeded") && act.contains("non_retryable: true"),
        "{act}"
    );
    assert_eq!(f.charged(run).await, TURN_1, "only message 1 was charged");
    // The sandbox command is gone: the sleep never finished, `after.txt` never written.
    while !host_pids_with(&format!("sleep {marker}")).is_empty() {
        assert!(
            Instant::now() < sleep_ends,
            "the command outlived the refused charge"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let ls = f
        .provisioner
        .exec(forkyard_proto::sandbox::v1::ExecRequest {
            sandbox_id: f.sandbox_id.clone(),
            argv: vec!["ls".into()],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(!ls.stdout.contains("after.txt"), "{}", ls.stdout);
    assert_eq!(beats.last().last_action, "stopped: charge refused");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_attempt_does_not_charge_again() {
    let mut f = fixture("http://127.0.0.1:1").await;
    let run = "run-stream-retry";
    let rsv = f.reservation(run, 1_000_000, 100_000).await;
    put(&mut f, "fake-claude", &claude_stream("0.012")).await;
    let req = request(&f, run, "sh fake-claude", &rsv);

    // Attempt 1 charges message 1, then its worker goes away (the activity is cancelled
    // under it) while the CLI waits.
    let beats = Beats::default();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let (runner, b, r) = (f.runner.clone(), beats.clone(), req.clone());
    let task =
        tokio::spawn(async move { runner.run(&r, &b, async { drop(rx.await) }, None, 1).await });
    let mut ledger = f.ledger.clone();
    wait_for("the first charge", async || {
        spent(&mut ledger, run).await == TURN_1
    })
    .await;
    wait_for("its heartbeat", async || beats.last().turns == 1).await;
    tx.send(()).unwrap();
    assert!(matches!(task.await.unwrap(), Err(AgentError::Cancelled)));
    let heartbeat: AgentProgress = beats.last();
    assert_eq!((heartbeat.turns, heartbeat.charged_micros), (1, TURN_1));

    // Attempt 2 runs the CLI afresh from attempt 1's last heartbeat: its reports are turns
    // 2 and 3, charged under new keys; attempt 1's charge is not posted again.
    put(&mut f, ".go", "").await;
    let beats2 = Beats::default();
    let out = f
        .runner
        .run(
            &req,
            &beats2,
            std::future::pending(),
            Some(heartbeat.clone()),
            2,
        )
        .await
        .expect("attempt 2");
    assert_eq!(out.turns, 3);
    let after = f.charged(run).await;
    assert_eq!(
        after,
        TURN_1 + TURN_1 + TURN_2,
        "attempt 1's charge once, attempt 2's messages each once"
    );
    assert_eq!(
        out.cost_micros,
        TURN_1 + 12_000,
        "attempt 1's charge and attempt 2's total"
    );
    let u = out.usage.unwrap();
    assert_eq!((u.input_tokens, u.output_tokens), (4000, 250));

    // The same attempt delivered again posts nothing new: every charge key is known.
    let again = f
        .runner
        .run(
            &req,
            &Beats::default(),
            std::future::pending(),
            Some(heartbeat),
            2,
        )
        .await
        .expect("attempt 2 again");
    assert_eq!(again.cost_micros, out.cost_micros);
    assert_eq!(f.charged(run).await, after, "nothing charged twice");
    commit(&mut f, &rsv, out.cost_micros).await;
    assert_eq!(
        f.charged(run).await,
        out.cost_micros,
        "the ledger matches the result"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn codex_turns_and_a_final_json_result_are_charged_too() {
    let mut f = fixture("http://127.0.0.1:1").await;
    let run = "run-codex";
    let rsv = f.reservation(run, 1_000_000, 100_000).await;
    // `codex exec --json`: per-turn usage, no price; priced by the spec's model (gpt-4o:
    // $2.50 in, $10 out, $1.25 cached per million tokens).
    let mut script = String::from("#!/bin/sh\n");
    script += &emit(r#"{"type":"thread.started","thread_id":"th-1"}"#);
    script += &emit(r#"{"type":"turn.started"}"#);
    script += &emit(
        r#"{"type":"item.completed","item":{"id":"item_0","type":"agent_message","text":"done"}}"#,
    );
    script += &emit(
        r#"{"type":"turn.completed","usage":{"input_tokens":1000,"cached_input_tokens":400,"output_tokens":100}}"#,
    );
    script += &emit(
        r#"{"type":"turn.completed","usage":{"input_tokens":500,"cached_input_tokens":0,"output_tokens":10}}"#,
    );
    put(&mut f, "fake-codex", &script).await;
    let mut req = request(&f, run, "sh fake-codex exec --json", &rsv);
    req.agent.as_mut().unwrap().model = "gpt-4o".into();
    let out = f
        .runner
        .run(&req, &Beats::default(), std::future::pending(), None, 1)
        .await
        .expect("codex");
    let first = 600 * 5 / 2 + 400 * 5 / 4 + 100 * 10; // 1500 + 500 + 1000
    let second = 500 * 5 / 2 + 10 * 10; // 1250 + 100
    assert_eq!(out.turns, 2);
    assert_eq!(out.cost_micros, first + second);
    assert_eq!(f.charged(run).await, first + second);
    let u = out.usage.unwrap();
    assert_eq!(
        (u.input_tokens, u.cache_read_tokens, u.output_tokens),
        (1100, 400, 110)
    );

    // `claude -p --output-format json`: one result object at the end, charged at the end.
    let run = "run-claude-json";
    let rsv = f.reservation(run, 1_000_000, 100_000).await;
    let result = r#"{"type":"result","subtype":"success","is_error":false,"num_turns":3,"result":"ok","total_cost_usd":0.0421,"usage":{"input_tokens":5000,"output_tokens":700,"cache_read_input_tokens":9,"cache_creation_input_tokens":0}}"#;
    put(
        &mut f,
        "fake-claude-json",
        &format!("#!/bin/sh\necho working >&2\n{}", emit(result)),
    )
    .await;
    let out = f
        .runner
        .run(
            &request(&f, run, "sh fake-claude-json -p --output-format json", &rsv),
            &Beats::default(),
            std::future::pending(),
            None,
            1,
        )
        .await
        .expect("claude json");
    assert_eq!(out.cost_micros, 42_100);
    assert_eq!(
        f.charged(run).await,
        0,
        "nothing streamed: the Commit charges it all"
    );
    commit(&mut f, &rsv, out.cost_micros).await;
    assert_eq!(f.charged(run).await, 42_100);
    assert_eq!(out.usage.unwrap().input_tokens, 5000);
    assert!(
        out.output_tail.contains("--- stderr ---\nworking"),
        "{}",
        out.output_tail
    );

    // No reservation (an operator's RunAgent): priced, reported, nothing charged.
    let out = f
        .runner
        .run(
            &request(&f, "run-unreserved", "sh fake-claude-json", ""),
            &Beats::default(),
            std::future::pending(),
            None,
            1,
        )
        .await
        .expect("unreserved");
    assert_eq!(out.cost_micros, 42_100);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_command_runs_as_a_shell_would_run_it() {
    let mut f = fixture("http://127.0.0.1:1").await;
    put(
        &mut f,
        "show-args",
        "#!/bin/sh\nprintf '%s|' \"$#\" \"$@\" \"$FORKYARD_FORK\" >&2\nexit 3\n",
    )
    .await;
    let run = |command: &'static str| {
        let (runner, req) = (f.runner.clone(), request(&f, "run-plain", command, ""));
        async move {
            runner
                .run(&req, &Beats::default(), std::future::pending(), None, 1)
                .await
                .expect(command)
        }
    };
    // One plain command (which a sandbox's init starts without the shell): the words as
    // given, the environment, the exit code.
    let out = run("./show-args  --task=a,b\t@x").await;
    assert_eq!(out.exit_code, 3, "{}", out.output_tail);
    assert!(
        out.output_tail.contains("2|--task=a,b|@x|1|"),
        "{}",
        out.output_tail
    );
    // What a shell reports for a program it cannot find, or cannot run.
    let out = run("no-such-agent --flag").await;
    assert_eq!(out.exit_code, 127, "{}", out.output_tail);
    assert!(
        out.output_tail.contains("no-such-agent"),
        "{}",
        out.output_tail
    );
    let out = run("./README.md").await;
    assert_eq!(out.exit_code, 126, "{}", out.output_tail);
    // With shell syntax, the shell.
    let out = run("./show-args \"$FORKYARD_FORK two\"").await;
    assert!(
        out.output_tail.contains("1|1 two|1|"),
        "{}",
        out.output_tail
    );
}
