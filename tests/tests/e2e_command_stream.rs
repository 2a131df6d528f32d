//! End to end: the `command` driver with an agent CLI that streams usage (the output of
//! `claude -p --output-format stream-json --verbose`, printed by a shell script in the
//! sandbox). Each message is charged to the ledger as it streams, the fork's Commit posts
//! only the rest of the CLI's own total, GetForkResult serves the command's transcript;
//! a budget that runs out mid-stream kills the command and the fork is BUDGET_EXCEEDED.

use forkyard_proto::{
    budget::v1::{Bucket, ListPostingsRequest, budget_ledger_client::BudgetLedgerClient},
    common::v1::{ForkResult, ForkStatus},
    gateway::v1::RunState,
};
use forkyard_tests::{
    Mesh, repo,
    support::{Gateway, Ledger, fork_result, launch, run_account, wait_finished},
};
use serde_json::{Value, json};
use std::{
    path::Path,
    time::{Duration, Instant},
};
use tonic::transport::Channel;

/// A Claude Code `assistant` line: one text block of message `id` (sonnet pricing).
fn assistant(id: &str, text: &str, input: u64, output: u64) -> String {
    json!({"type": "assistant", "message": {"id": id, "type": "message", "role": "assistant",
        "model": "claude-sonnet-4-5", "content": [{"type": "text", "text": text}],
        "usage": {"input_tokens": input, "output_tokens": output,
                  "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}},
        "parent_tool_use_id": null, "session_id": "sess-e2e"})
    .to_string()
}

/// `sh` that prints `line`.
fn emit(line: &str) -> String {
    format!("printf '%s\\n' '{}'\n", line.replace('\'', r"'\''"))
}

async fn charges(ledger: &mut BudgetLedgerClient<Channel>, run_id: &str) -> Vec<(String, i64)> {
    ledger
        .list_postings(ListPostingsRequest {
            account_id: run_id.into(),
            page_size: 1000,
            page_token: String::new(),
        })
        .await
        .unwrap()
        .into_inner()
        .postings
        .into_iter()
        .filter(|p| p.bucket == Bucket::Spent as i32 && p.amount_micros != 0)
        .map(|p| (p.kind, p.amount_micros))
        .collect()
}

/// The agent: two messages streamed with the edit between them, then the CLI's total.
fn two_message_stream() -> String {
    // Message 1 is printed once per content block (the same usage twice): 4,500 micro-USD
    // once. Message 2: 6,750. The CLI's own total, $0.012, is 750 more.
    let mut agent = emit(&assistant("msg_01", "Adding a line.", 1000, 100));
    agent += &emit(&assistant("msg_01", "(tool_use block)", 1000, 100));
    agent += "echo four >> src/lib.txt\n";
    agent += &emit(&assistant("msg_02", "Done.", 2000, 50));
    agent += &emit(
        r#"{"type":"result","subtype":"success","is_error":false,"num_turns":2,"total_cost_usd":0.012,"usage":{"input_tokens":3000,"output_tokens":150,"cache_creation_input_tokens":0,"cache_read_input_tokens":0}}"#,
    );
    agent
}

/// The fork's messages were charged as they streamed and its commit posted the rest of
/// the CLI's total: the fork's result.
async fn assert_charged_per_message(
    gw: &mut Gateway,
    ledger: &mut Ledger,
    run_id: &str,
) -> ForkResult {
    let run = wait_finished(gw, run_id, Duration::from_secs(120)).await;
    assert_eq!(run.state, RunState::Completed as i32, "{run:#?}");
    let fork = fork_result(gw, run_id, 1).await;
    assert_eq!(fork.status, ForkStatus::Succeeded as i32, "{fork:#?}");
    assert!(fork.patch.contains("+four"), "{}", fork.patch);
    assert_eq!(fork.cost_micros, 12_000);
    let usage = fork.usage.unwrap();
    assert_eq!((usage.input_tokens, usage.output_tokens), (3000, 150));
    assert_eq!(
        charges(ledger, run_id).await,
        [
            ("CHARGE".to_owned(), 4_500),
            ("CHARGE".to_owned(), 6_750),
            ("COMMIT".to_owned(), 750)
        ],
        "each message charged as it streamed, the rest of the CLI's total at commit"
    );
    let account = run_account(ledger, run_id).await;
    assert_eq!((account.spent_micros, account.reserved_micros), (12_000, 0));
    fork
}

/// GetForkResult serves the command's transcript: its usage lines and its result.
fn assert_transcript_of_the_stream(fork: &ForkResult) {
    let lines: Vec<Value> = fork
        .transcript
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(
        lines.first().unwrap()["driver"],
        "command",
        "{}",
        fork.transcript
    );
    assert_eq!(
        lines.iter().filter(|l| l["type"] == "usage").count(),
        2,
        "{}",
        fork.transcript
    );
    assert!(lines.iter().any(|l| l["event"]["type"] == "result"));
    assert_eq!(lines.last().unwrap()["type"], "end");
}

/// A budget that runs out mid-stream kills the command: the fork is BUDGET_EXCEEDED.
async fn assert_a_spent_budget_kills_the_stream(
    gw: &mut Gateway,
    ledger: &mut Ledger,
    repo_dir: &Path,
) {
    // $0.006 for the run: message 1 fits, message 2 is refused and the command, which
    // would sleep and then write a file, is killed.
    let marker = format!("{}.{}", 400 + std::process::id() % 300, 23);
    let mut agent = emit(&assistant("msg_01", "one", 1000, 100));
    agent += &emit(&assistant("msg_02", "two", 1000, 100));
    agent += &format!("sleep {marker}\necho late > late.txt\n");
    let mut req = launch(repo_dir, 1, 1, &agent);
    req.request_id = "stream-json-budget".into();
    req.budget_usd = "0.006".into();
    let started = Instant::now();
    let run_id = gw.launch_run(req).await.unwrap().into_inner().run_id;
    let run = wait_finished(gw, &run_id, Duration::from_secs(120)).await;
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "the fork ended at the refusal, not after the sleep"
    );
    let fork = fork_result(gw, &run_id, 1).await;
    assert_eq!(
        fork.status,
        ForkStatus::BudgetExceeded as i32,
        "{run:#?} {fork:#?}"
    );
    assert!(fork.error.contains("usage reports"), "{}", fork.error);
    assert_eq!(fork.cost_micros, 4_500, "{fork:#?}");
    let account = run_account(ledger, &run_id).await;
    assert_eq!((account.spent_micros, account.reserved_micros), (4_500, 0));
    let pids = |marker: &str| {
        std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter(|e| {
                std::fs::read(e.path().join("cmdline")).is_ok_and(|c| {
                    String::from_utf8_lossy(&c)
                        .replace('\0', " ")
                        .contains(marker)
                })
            })
            .count()
    };
    assert_eq!(
        pids(&format!("sleep {marker}")),
        0,
        "the command was killed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streaming_cli_is_charged_per_message_and_stopped_by_the_budget() {
    let mesh = Mesh::start().await.expect("mesh");
    let dir = tempfile::tempdir().unwrap();
    let repo_dir = dir.path().join("repo");
    repo::create(&repo_dir).unwrap();
    let mut gw = Gateway::new(mesh.channel("gateway").await.unwrap());
    let mut ledger = Ledger::new(mesh.channel("budget-ledger").await.unwrap());

    let mut req = launch(&repo_dir, 1, 1, &two_message_stream());
    req.request_id = "stream-json".into();
    let run_id = gw.launch_run(req).await.unwrap().into_inner().run_id;
    let fork = assert_charged_per_message(&mut gw, &mut ledger, &run_id).await;
    assert_transcript_of_the_stream(&fork);
    assert_a_spent_budget_kills_the_stream(&mut gw, &mut ledger, &repo_dir).await;
}
