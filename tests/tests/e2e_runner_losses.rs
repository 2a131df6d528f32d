//! The agent runner killed twice while one agent runs: a lost worker is not the
//! agent's failure. The fork succeeds (its agent started over in the same sandbox at
//! each new attempt, charged once), where two kills used to spend the agent's two
//! attempts and fail the fork with `run agent: activity Heartbeat timeout`.

use forkyard_common::testing::host_pids_with;
use forkyard_proto::{
    budget::v1::budget_ledger_client::BudgetLedgerClient,
    common::v1::ForkStatus,
    gateway::v1::{LaunchRunRequest, RunState},
};
use forkyard_tests::{
    Mesh, repo,
    support::{
        Gateway, assert_nothing_left_on_host, fork_result, launch, run_account, wait_finished,
    },
};
use std::time::{Duration, Instant};

/// Wait until a process whose command line holds `marker` runs, other than `not`.
async fn agent_running(marker: &str, not: &[u32], limit: Duration) -> u32 {
    let start = Instant::now();
    loop {
        if let Some(pid) = host_pids_with(marker)
            .into_iter()
            .find(|p| !not.contains(p))
        {
            return pid;
        }
        assert!(
            start.elapsed() < limit,
            "no agent process {marker} within {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_runner_crashes_during_one_agent_do_not_fail_the_fork() {
    let mut mesh = Mesh::start().await.expect("mesh starts");
    let src = tempfile::tempdir().unwrap();
    repo::create(src.path()).unwrap();
    let mut gw = Gateway::new(mesh.channel("gateway").await.unwrap());
    // A sleep whose argument no other process has, to find the agent on the host; the
    // shell's own command line spells it differently (`${s}`), so only the sleep matches.
    let (secs, frac) = (40 + std::process::id() % 50, std::process::id() % 1_000_000);
    let marker = format!("{secs}.{frac:06}");
    let agent = format!(
        r#"s={secs}; sleep ${{s}}.{frac:06}; echo done > done.txt; printf '{{"total_cost_usd": 0.01}}\n'"#
    );
    let req = LaunchRunRequest {
        request_id: "runner-losses".into(),
        fork_timeout_secs: 600,
        ..launch(src.path(), 1, 1, &agent)
    };
    let run_id = gw.launch_run(req).await.unwrap().into_inner().run_id;
    let sleep = format!("sleep {marker}");
    let mut seen = Vec::new();
    for kill in 1..=2 {
        let pid = agent_running(&sleep, &seen, Duration::from_secs(180)).await;
        seen.push(pid);
        mesh.kill9("agent-runner");
        mesh.start_service("agent-runner").unwrap();
        mesh.wait_serving("agent-runner", Duration::from_secs(60))
            .await
            .unwrap();
        eprintln!("kill {kill}: agent-runner killed while agent process {pid} ran");
    }
    // The third attempt's agent starts after the second loss is noticed; speed it up by
    // ending its sleep: the test is about the attempts, not the agent's length.
    let third = agent_running(&sleep, &seen, Duration::from_secs(180)).await;
    let _ = std::process::Command::new("kill")
        .arg(third.to_string())
        .status();

    let run = wait_finished(&mut gw, &run_id, Duration::from_secs(300)).await;
    let f = fork_result(&mut gw, &run_id, 1).await;
    assert_eq!(run.state, RunState::Completed as i32, "{run:#?}");
    assert_eq!(f.status, ForkStatus::Succeeded as i32, "{f:#?}");
    assert!(f.patch.contains("+done"), "{}", f.patch);
    // Started over, charged once: the agent's report is its cost.
    assert_eq!(f.model_cost_micros, 10_000, "{f:#?}");
    let mut ledger = BudgetLedgerClient::new(mesh.channel("budget-ledger").await.unwrap());
    assert_eq!(
        run_account(&mut ledger, &run_id).await.spent_micros,
        f.cost_micros
    );
    forkyard_tests::support::left_after_settling(|| {
        forkyard_tests::support::workspaces_left(mesh.state_dir())
    })
    .await;
    assert_nothing_left_on_host(mesh.state_dir());
}
