//! A sandbox's disk limit while the agent runs: an agent that writes past it is stopped
//! within seconds, its fork fails saying why, the file it wrote stays out of the patch
//! (not hashed), and the sandbox is destroyed. A fork within its limit is untouched.

use forkyard_proto::{
    common::v1::ForkStatus,
    gateway::v1::{LaunchRunRequest, RunState, gateway_client::GatewayClient},
};
use forkyard_tests::{
    Mesh,
    mesh::MeshOptions,
    repo,
    support::{
        fork_result, launch, left_after_settling, sandbox_processes, wait_finished, workspaces_left,
    },
};
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_writing_past_the_disk_limit_is_stopped_and_its_fork_fails_saying_why() {
    let options = MeshOptions {
        service_env: vec![(
            "sandbox-provisioner".into(),
            "FORKYARD_SANDBOX_DISK_MB".into(),
            "48".into(),
        )],
        ..Default::default()
    };
    let mesh = Mesh::start_with(options).await.expect("mesh");
    let dir = tempfile::tempdir().unwrap();
    repo::create(dir.path()).unwrap();
    let mut gw = GatewayClient::new(mesh.channel("gateway").await.unwrap());

    // 70 MiB against a 48 MiB limit: under the largest file a sandbox may write
    // (RLIMIT_FSIZE, the quota's wall: 80 MiB here; a file past it fails inside the
    // sandbox, `tests/disk_writes.rs`) and over the largest a patch stages (64 MiB). Then
    // a minute of waiting it must not get; a small change beside it, which the patch keeps.
    let over = r#"echo kept >> README.md
fallocate -l 70M big.bin
sleep 60
echo never >> README.md"#;
    let req = LaunchRunRequest {
        request_id: "disk-over".into(),
        ..launch(dir.path(), 1, 1, over)
    };
    let run_id = gw.launch_run(req).await.unwrap().into_inner().run_id;
    let run = wait_finished(&mut gw, &run_id, Duration::from_secs(120)).await;
    assert_eq!(run.state, RunState::Failed as i32, "{run:#?}");
    let fork = fork_result(&mut gw, &run_id, 1).await;
    assert_eq!(fork.status, ForkStatus::Failed as i32, "{fork:#?}");
    assert!(fork.error.contains("disk limit"), "{}", fork.error);
    assert!(
        fork.agent_duration_ms < 60_000,
        "stopped before its sleep ended: {} ms",
        fork.agent_duration_ms
    );
    assert_eq!(fork.patch_skipped_files, vec!["big.bin".to_owned()]);
    assert!(fork.patch.contains("+kept"), "{}", fork.patch);
    assert!(!fork.patch.contains("never"), "{}", fork.patch);

    // Within the limit: nothing stops it, nothing is skipped.
    let within = "fallocate -l 8M small.bin && echo ok >> README.md";
    let req = LaunchRunRequest {
        request_id: "disk-within".into(),
        ..launch(dir.path(), 1, 1, within)
    };
    let run_id = gw.launch_run(req).await.unwrap().into_inner().run_id;
    let run = wait_finished(&mut gw, &run_id, Duration::from_secs(120)).await;
    assert_eq!(run.state, RunState::Completed as i32, "{run:#?}");
    let fork = fork_result(&mut gw, &run_id, 1).await;
    assert_eq!(fork.status, ForkStatus::Succeeded as i32, "{fork:#?}");
    assert!(fork.patch_skipped_files.is_empty(), "{fork:#?}");
    assert!(fork.patch.contains("small.bin"), "{}", fork.patch);

    let workspaces = left_after_settling(|| workspaces_left(mesh.state_dir())).await;
    assert!(
        workspaces.is_empty(),
        "sandboxes not destroyed: {workspaces:?}"
    );
    let processes = left_after_settling(|| sandbox_processes(mesh.state_dir())).await;
    assert!(processes.is_empty(), "{processes:?}");
}
