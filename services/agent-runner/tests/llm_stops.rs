//! The LLM drivers stopped and resumed, end to end as in `llm.rs` (local model servers,
//! a real bubblewrap sandbox, a real ledger): a refused charge, cancellation mid
//! conversation, a retried attempt, a ledger outage.

mod common;

use common::{llm_agent::*, *};
use forkyard_agent_runner::{error::AgentError, llm::LlmError};
use forkyard_proto::{
    agent::v1::AgentProgress, budget::v1::budget_ledger_client::BudgetLedgerClient,
};
use serde_json::json;
use std::{
    sync::Arc,
    time::{Duration, Instant},
};

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
    // The sleep would end by itself this long after the cancel, at the earliest: the
    // agent and its command must stop before that (how soon is no target of a test).
    let sleep_ends = Instant::now() + Duration::from_secs_f64(marker.parse().unwrap());
    tx.send(()).unwrap();
    let res = tokio::time::timeout_at(sleep_ends.into(), task)
        .await
        .expect("the agent ran on past the cancel")
        .unwrap();
    assert!(matches!(res, Err(AgentError::Cancelled)), "{res:?}");
    while !host_pids_with(&format!("sleep {marker}")).is_empty() {
        assert!(
            Instant::now() < sleep_ends,
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
