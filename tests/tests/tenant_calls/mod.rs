//! Calls as a tenant: keys made with the `forkyard keys` CLI, requests carrying a key,
//! and the run RPCs as another tenant sees them.

use forkyard_proto::common::v1::ForkResult;
use forkyard_proto::gateway::v1::{
    CancelForkRequest, CancelRunRequest, GetForkResultRequest, GetRunRequest, LaunchRunRequest,
    ListRunsRequest, PauseRunRequest, RaiseBudgetRequest, ResumeRunRequest, Run, RunState,
    WatchRunRequest, gateway_client::GatewayClient,
};
use forkyard_tests::{Mesh, mesh::bin_dir, support::launch};
use std::{
    path::Path,
    time::{Duration, Instant},
};
use tonic::{Code, Request, transport::Channel};

pub type Gw = GatewayClient<Channel>;

/// `forkyard keys …` against the mesh gateway's key file; its stdout.
pub fn keys(mesh: &Mesh, args: &[&str]) -> String {
    let out = std::process::Command::new(bin_dir().join("forkyard"))
        .env("FORKYARD_STATE_DIR", mesh.state_dir())
        .args(["-o", "json", "keys"])
        .args(args)
        .output()
        .expect("run forkyard");
    assert!(
        out.status.success(),
        "forkyard keys {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A new key for `tenant`: (id, key).
pub fn new_key(mesh: &Mesh, tenant: &str) -> (String, String) {
    let v: serde_json::Value =
        serde_json::from_str(&keys(mesh, &["create", "--tenant", tenant])).expect("json");
    (
        v["id"].as_str().unwrap().to_owned(),
        v["key"].as_str().unwrap().to_owned(),
    )
}

pub fn with_key<T>(key: &str, msg: T) -> Request<T> {
    let mut r = Request::new(msg);
    r.metadata_mut()
        .insert("authorization", format!("Bearer {key}").parse().unwrap());
    r.set_timeout(Duration::from_secs(20));
    r
}

pub async fn get(gw: &mut Gw, key: &str, run_id: &str) -> Result<Run, tonic::Status> {
    gw.get_run(with_key(
        key,
        GetRunRequest {
            run_id: run_id.into(),
        },
    ))
    .await
    .map(tonic::Response::into_inner)
}

pub async fn wait_closed(gw: &mut Gw, key: &str, run_id: &str, timeout: Duration) -> Run {
    let deadline = Instant::now() + timeout;
    loop {
        let run = get(gw, key, run_id).await.expect("own run");
        let live = [
            RunState::Running as i32,
            RunState::Paused as i32,
            RunState::AwaitingBudget as i32,
        ];
        if !live.contains(&run.state) {
            return run;
        }
        assert!(Instant::now() < deadline, "run never finished: {run:#?}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// A run launched as `key`'s tenant, to its end (within 180 s), with each fork's whole
/// result (`GetForkResult`: patch, delivery).
pub async fn run_as(gw: &mut Gw, key: &str, req: LaunchRunRequest) -> (Run, Vec<ForkResult>) {
    let id = gw
        .launch_run(with_key(key, req))
        .await
        .expect("launch")
        .into_inner()
        .run_id;
    let run = wait_closed(gw, key, &id, Duration::from_secs(180)).await;
    let mut forks = Vec::new();
    for fork in 1..=u32::try_from(run.forks.len()).unwrap() {
        let asked = with_key(
            key,
            GetForkResultRequest {
                run_id: id.clone(),
                fork,
            },
        );
        forks.push(
            gw.get_fork_result(asked)
                .await
                .expect("fork result")
                .into_inner(),
        );
    }
    (run, forks)
}

pub fn launch_req(repo: &Path, request_id: &str, command: &str) -> LaunchRunRequest {
    LaunchRunRequest {
        request_id: request_id.into(),
        ..launch(repo, 1, 1, command)
    }
}

/// Every run RPC tenant B might aim at A's run, each must be NOT_FOUND.
/// Each call a tenant makes about a run, by name, and the code it was refused with
/// (`None`: answered).
async fn calls_about(gw: &mut Gw, key: &str, run_id: &str) -> Vec<(&'static str, Option<Code>)> {
    let id = || run_id.to_owned();
    let codes = [
        ("GetRun", get(gw, key, run_id).await.err().map(|s| s.code())),
        (
            "WatchRun",
            gw.watch_run(with_key(key, WatchRunRequest { run_id: id() }))
                .await
                .err()
                .map(|s| s.code()),
        ),
        (
            "PauseRun",
            gw.pause_run(with_key(key, PauseRunRequest { run_id: id() }))
                .await
                .err()
                .map(|s| s.code()),
        ),
        (
            "ResumeRun",
            gw.resume_run(with_key(key, ResumeRunRequest { run_id: id() }))
                .await
                .err()
                .map(|s| s.code()),
        ),
        (
            "CancelRun",
            gw.cancel_run(with_key(
                key,
                CancelRunRequest {
                    run_id: id(),
                    reason: String::new(),
                },
            ))
            .await
            .err()
            .map(|s| s.code()),
        ),
        (
            "CancelFork",
            gw.cancel_fork(with_key(
                key,
                CancelForkRequest {
                    run_id: id(),
                    fork: 1,
                    ..Default::default()
                },
            ))
            .await
            .err()
            .map(|s| s.code()),
        ),
        (
            "RaiseBudget",
            gw.raise_budget(with_key(
                key,
                RaiseBudgetRequest {
                    run_id: id(),
                    amount_usd: "1".into(),
                },
            ))
            .await
            .err()
            .map(|s| s.code()),
        ),
        (
            "GetForkResult",
            gw.get_fork_result(with_key(
                key,
                GetForkResultRequest {
                    run_id: id(),
                    fork: 1,
                },
            ))
            .await
            .err()
            .map(|s| s.code()),
        ),
    ];
    codes.into()
}

/// Every call about another tenant's run is NOT_FOUND, as for a run that does not exist.
pub async fn assert_invisible(gw: &mut Gw, key: &str, run_id: &str) {
    for (rpc, code) in calls_about(gw, key, run_id).await {
        assert_eq!(code, Some(Code::NotFound), "{rpc} of another tenant's run");
    }
}

/// An admin tenant reads another tenant's run and changes nothing of it.
pub async fn assert_admin_reads_only(gw: &mut Gw, admin_key: &str, run_id: &str) {
    for (rpc, code) in calls_about(gw, admin_key, run_id).await {
        let want = match rpc {
            "GetRun" | "WatchRun" | "GetForkResult" => None,
            _ => Some(Code::PermissionDenied),
        };
        assert_eq!(code, want, "the admin's {rpc} of another tenant's run");
    }
}

pub async fn list_ids(gw: &mut Gw, key: &str) -> Vec<String> {
    gw.list_runs(with_key(key, ListRunsRequest::default()))
        .await
        .expect("list")
        .into_inner()
        .runs
        .into_iter()
        .map(|r| r.run_id)
        .collect()
}
