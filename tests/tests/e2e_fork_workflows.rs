//! End to end: where a fork's steps run. A run of more forks than the gateway's
//! `--inline-fork-limit` gives each fork a child workflow; a smaller run runs them in its
//! own workflow and hands only a fork whose patch is too large for its history to a
//! child. Either way every fork's result is whole, the ledger exact and nothing leaks.

use forkyard_proto::{
    common::v1::ForkStatus,
    gateway::v1::{LaunchRunRequest, Run, RunState, gateway_client::GatewayClient},
    sandbox::v1::{ListSandboxesRequest, sandbox_provisioner_client::SandboxProvisionerClient},
};
use forkyard_tests::{
    Mesh,
    mesh::MeshOptions,
    repo,
    support::{
        fork_result, launch, run_account, sandbox_processes, wait_finished, workspaces_left,
    },
};
use std::time::Duration;
use tonic::transport::Channel;

/// Fork 2 writes a 40,000-byte file (its patch is larger than an inline fork keeps);
/// every fork writes a small one and reports a cost of fork × 1,000 micro-USD.
const AGENT: &str = r#"if [ "$FORKYARD_FORK" = 2 ]; then yes 'line of a large patch' | head -c 40000 > big.txt; echo end-of-big >> big.txt; fi
echo "fork $FORKYARD_FORK" > "fork-$FORKYARD_FORK.txt"
printf '{"type":"result","total_cost_usd":0.00%d,"usage":{"input_tokens":10,"output_tokens":2}}\n' "$FORKYARD_FORK""#;

async fn finished_run(
    gw: &mut GatewayClient<Channel>,
    src: &std::path::Path,
    request_id: &str,
    forks: u32,
) -> Run {
    let launched = gw
        .launch_run(LaunchRunRequest {
            request_id: request_id.into(),
            ..launch(src, forks, forks, AGENT)
        })
        .await
        .expect("launch")
        .into_inner();
    let run = wait_finished(gw, &launched.run_id, Duration::from_secs(180)).await;
    assert_eq!(run.state, RunState::Completed as i32, "{run:#?}");
    assert_eq!(run.forks_succeeded, forks, "{run:#?}");
    run
}

/// Every fork's full result: its own small file, fork 2's whole large patch, its cost;
/// the ledger agrees and nothing is left behind.
async fn check_forks(mesh: &Mesh, gw: &mut GatewayClient<Channel>, run: &Run) {
    let run_id = &run.run_id;
    for summary in &run.forks {
        let f = fork_result(gw, run_id, summary.fork).await;
        assert_eq!(f.status, ForkStatus::Succeeded as i32, "{f:?}");
        assert!(
            f.patch.contains(&format!("+fork {}", f.fork)),
            "fork {} patch:\n{}",
            f.fork,
            f.patch
        );
        assert!(!f.patch_truncated, "fork {}", f.fork);
        assert_eq!(f.patch.len() as u64, f.patch_bytes, "fork {}", f.fork);
        if f.fork == 2 {
            assert!(f.patch_bytes > 40_000, "{}", f.patch_bytes);
            assert!(f.patch.contains("end-of-big"), "the large patch is whole");
        } else {
            assert!(f.patch_bytes < 1_000, "{}", f.patch_bytes);
        }
        assert_eq!(f.cost_micros, i64::from(f.fork) * 1_000, "fork {}", f.fork);
        assert!(f.sandbox_ready_unix_ms > 0 && f.finished_unix_ms > 0);
    }
    let mut ledger = forkyard_proto::budget::v1::budget_ledger_client::BudgetLedgerClient::new(
        mesh.channel("budget-ledger").await.unwrap(),
    );
    let account = run_account(&mut ledger, run_id).await;
    let total: i64 = run.forks.iter().map(|f| f.cost_micros).sum();
    assert_eq!(account.spent_micros, total);
    assert_eq!(account.reserved_micros, 0);
    let mut prov =
        SandboxProvisionerClient::new(mesh.channel("sandbox-provisioner").await.unwrap());
    let left = prov
        .list_sandboxes(ListSandboxesRequest::default())
        .await
        .unwrap()
        .into_inner()
        .sandboxes;
    assert!(left.is_empty(), "sandboxes left: {left:?}");
    assert!(workspaces_left(mesh.state_dir()).is_empty());
    assert!(sandbox_processes(mesh.state_dir()).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn small_runs_run_forks_inline_and_large_runs_and_patches_in_fork_workflows() {
    let mesh = Mesh::start_with(MeshOptions {
        env: vec![("FORKYARD_INLINE_FORK_LIMIT".into(), "2".into())],
        ..MeshOptions::default()
    })
    .await
    .expect("mesh starts");
    let src = tempfile::tempdir().unwrap();
    repo::create(src.path()).unwrap();
    let mut gw = GatewayClient::new(mesh.channel("gateway").await.unwrap());

    // Two forks: inline; fork 2's patch goes on in a child of its own.
    let inline = finished_run(&mut gw, src.path(), "inline", 2).await;
    assert!(inline.spec.as_ref().unwrap().inline_forks);
    check_forks(&mesh, &mut gw, &inline).await;

    // Three forks, above the limit: every fork in a child workflow.
    let children = finished_run(&mut gw, src.path(), "children", 3).await;
    assert!(!children.spec.as_ref().unwrap().inline_forks);
    check_forks(&mesh, &mut gw, &children).await;
}
