//! A fork's agent and a model that misbehaves, through the whole mesh: Claude Code with a
//! model that never stops is stopped at the fork's budget, with the ledger holding the
//! charges it accepted; an agent whose model API was down is retried, and the failed
//! call costs nothing.
//!
//! `make test` installs the CLIs (pinned, from npm); without them these tests fail.

mod agent_cli;

use agent_cli::model_mesh::{assert_cli_installed, launch, options, price_per_call};
use forkyard_proto::{
    budget::v1::budget_ledger_client::BudgetLedgerClient, common::v1::ForkStatus,
    gateway::v1::LaunchRunRequest,
};
use forkyard_tests::{
    Mesh, repo,
    scripted_model::{Script, ScriptedModel},
    support::{Gateway, fork_result, run_account, run_to_end},
};
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_that_never_stops_is_stopped_at_the_forks_budget() {
    assert_cli_installed("claude");
    let model = ScriptedModel::start(Script::never_stop("echo again >> notes.txt")).await;
    let mesh = Mesh::start_with(options(&model)).await.expect("mesh");
    let dir = tempfile::tempdir().unwrap();
    let repo_dir = dir.path().join("repo");
    repo::create(&repo_dir).unwrap();
    let mut gw = Gateway::new(mesh.channel("gateway").await.unwrap());
    let per_call = price_per_call(3.0, 15.0, 0.3);
    // Room for three calls' charges, not four.
    let budget = format!("0.{:06}", per_call * 3 + per_call / 2);
    let req = LaunchRunRequest {
        request_id: "never-stops".into(),
        ..launch(&repo_dir, "claude-code", "sonnet", 1, &budget)
    };
    let (run_id, run) = run_to_end(&mut gw, req, Duration::from_secs(180)).await;
    let fork = fork_result(&mut gw, &run_id, 1).await;
    assert_eq!(
        fork.status,
        ForkStatus::BudgetExceeded as i32,
        "{fork:#?} {run:#?}"
    );
    let mut ledger = BudgetLedgerClient::new(mesh.channel("budget-ledger").await.unwrap());
    let account = run_account(&mut ledger, &run_id).await;
    assert_eq!(
        account.spent_micros,
        3 * per_call,
        "three charges accepted, the fourth refused"
    );
    assert_eq!(account.reserved_micros, 0);
    assert_eq!(fork.cost_micros, account.spent_micros);
    // The fourth answer's charge was refused; nothing after it reached the model.
    assert_eq!(
        model.model_calls().len(),
        4,
        "{:?}",
        model.model_calls().len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_failed_by_a_down_model_api_is_retried_and_charged_once() {
    let mut script = Script::edit("true");
    script.fail_first = 1;
    let model = ScriptedModel::start(script).await;
    let mesh = Mesh::start_with(options(&model)).await.expect("mesh");
    let dir = tempfile::tempdir().unwrap();
    let repo_dir = dir.path().join("repo");
    repo::create(&repo_dir).unwrap();
    let mut gw = Gateway::new(mesh.channel("gateway").await.unwrap());
    // A plain command calling the Messages API through the gateway; curl -f fails on 503.
    let command = r#"curl -sSf -H "x-api-key: $ANTHROPIC_API_KEY" -H 'anthropic-version: 2023-06-01' -H 'content-type: application/json' -d '{"model":"claude-haiku-4-5","max_tokens":16,"messages":[{"role":"user","content":"hi"}]}' "$ANTHROPIC_BASE_URL/v1/messages" > answer.json"#;
    let req = LaunchRunRequest {
        request_id: "api-down".into(),
        ..launch(&repo_dir, "command", "", 1, "1")
    };
    let mut req = req;
    req.agent.as_mut().unwrap().command = command.into();
    let (run_id, run) = run_to_end(&mut gw, req, Duration::from_secs(120)).await;
    let fork = fork_result(&mut gw, &run_id, 1).await;
    assert_eq!(
        fork.status,
        ForkStatus::Succeeded as i32,
        "{fork:#?} {run:#?}"
    );
    assert!(
        fork.patch.contains("msg_scripted_2"),
        "the second attempt's answer: {}",
        fork.patch
    );
    assert_eq!(
        model.model_calls().len(),
        2,
        "one failed call, one answered"
    );
    // claude-haiku-4-5: 800 in × $1, 200 cache read × $0.10, 200 out × $5 per million.
    let per_call = price_per_call(1.0, 5.0, 0.1);
    assert_eq!(fork.model_cost_micros, per_call, "{fork:#?}");
    let mut ledger = BudgetLedgerClient::new(mesh.channel("budget-ledger").await.unwrap());
    let account = run_account(&mut ledger, &run_id).await;
    assert_eq!(
        account.spent_micros, per_call,
        "the failed call cost nothing, the answer once"
    );
}
