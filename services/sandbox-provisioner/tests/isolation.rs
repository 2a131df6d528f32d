//! What a command inside a sandbox can see and do, and that it dies when it should.

mod common;

use common::{eventually, exec_req, fixture, host_pids_with, unique_sleep};
use forkyard_proto::sandbox::v1::DestroySandboxRequest;
use std::time::Duration;

#[tokio::test]
async fn exec_sees_only_the_workspace_and_no_host_processes() {
    let f = fixture().await;
    let sbx = f.create().await;
    let out = f.sh(&sbx.id, "pwd; ls /workspace; ls /").await;
    assert_eq!(out.exit_code, 0, "{}", out.stderr);
    let mut lines = out.stdout.lines();
    assert_eq!(lines.next(), Some("/workspace"));
    assert!(out.stdout.contains("README.md"), "{}", out.stdout);
    for hidden in ["root", "home", "work", "var", "opt", "mnt", "srv", "boot"] {
        assert!(
            !out.stdout.lines().any(|l| l == hidden),
            "/{hidden} visible: {}",
            out.stdout
        );
    }
    let out = f.sh(&sbx.id, "ls /root; ls /home").await;
    assert_ne!(out.exit_code, 0);
    assert!(out.stderr.contains("No such file"), "{}", out.stderr);

    let out = f.sh(&sbx.id, "ls /etc").await;
    let etc: Vec<&str> = out.stdout.lines().collect();
    assert!(
        !etc.contains(&"shadow") && !etc.contains(&"hostname") && !etc.contains(&"resolv.conf"),
        "{etc:?}"
    );

    // Only the sandbox's own processes: bwrap's pid 1, the sandbox's init, sh, ls and
    // grep, numbered in the sandbox's own pid namespace.
    let out = f.sh(&sbx.id, "ls /proc | grep -E '^[0-9]+$'").await;
    let pids: Vec<u32> = out.stdout.lines().map(|l| l.parse().unwrap()).collect();
    assert!(!pids.is_empty() && pids.len() <= 5, "{pids:?}");
    assert!(
        pids.contains(&1) && pids.iter().all(|p| *p < 100),
        "{pids:?}"
    );
}

#[tokio::test]
async fn exec_has_no_network_and_its_own_hostname() {
    let f = fixture().await;
    let sbx = f.create().await;
    let out = f
        .sh(
            &sbx.id,
            "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '; hostname",
        )
        .await;
    assert_eq!(out.exit_code, 0, "{}", out.stderr);
    assert_eq!(out.stdout, "lo\nforkyard-sandbox\n");
}

#[tokio::test]
async fn exec_environment_is_rebuilt_from_scratch() {
    // `std::env::set_var` is unsafe in edition 2024 (and unsafe code is forbidden here), so
    // the host marker is a variable the test runner always sets in this process.
    let host_var = "CARGO_PKG_NAME";
    assert!(
        std::env::var(host_var).is_ok(),
        "cargo sets {host_var} for tests"
    );
    let f = fixture().await;
    let sbx = f.create().await;
    let mut req = exec_req(&sbx.id, &["env"]);
    req.env.insert("AGENT_TOKEN".into(), "t0k3n".into());
    let out = f.core.exec(req).await.unwrap();
    let mut vars: Vec<&str> = out
        .stdout
        .lines()
        .map(|l| l.split('=').next().unwrap())
        .collect();
    vars.sort_unstable();
    assert_eq!(
        vars,
        [
            "AGENT_TOKEN",
            "FORKYARD_SANDBOX_ID",
            "HOME",
            "LANG",
            "PATH",
            "PWD"
        ],
        "{}",
        out.stdout
    );
    assert!(
        out.stdout
            .contains(&format!("FORKYARD_SANDBOX_ID={}\n", sbx.id))
    );
    assert!(out.stdout.contains("AGENT_TOKEN=t0k3n\n"));
    assert!(!out.stdout.contains(host_var));
}

#[tokio::test]
async fn exec_output_is_capped_and_flagged() {
    let f = fixture().await;
    let sbx = f.create().await;
    let out = f
        .sh(
            &sbx.id,
            "head -c 3000000 /dev/zero | tr '\\0' a; echo done >&2",
        )
        .await;
    assert_eq!(out.exit_code, 0);
    assert!(out.output_truncated);
    assert_eq!(out.stdout.len(), 1024 * 1024);
    assert_eq!(out.stderr, "done\n");
    let out = f.sh(&sbx.id, "exit 7").await;
    assert_eq!(out.exit_code, 7);
    assert!(!out.output_truncated && !out.timed_out);
}

#[tokio::test]
async fn exec_timeout_kills_the_command() {
    let f = fixture().await;
    let sbx = f.create().await;
    let secs = unique_sleep();
    let mut req = exec_req(
        &sbx.id,
        &["sh", "-c", &format!("echo started; sleep {secs}")],
    );
    req.timeout_secs = 1;
    let out = f.core.exec(req).await.unwrap();
    assert!(out.timed_out);
    assert_eq!(out.exit_code, -1);
    // Not before its timeout, and killed then rather than let run its sleep (300 s or
    // more). (How long past its timeout an exec returns is `make bench-provisioner`'s.)
    let sleep_ms: f64 = secs.parse::<f64>().unwrap() * 1000.0;
    assert!(
        out.duration_ms >= 1000 && (out.duration_ms as f64) < sleep_ms,
        "{}",
        out.duration_ms
    );
    assert_eq!(out.stdout, "started\n");
    assert!(eventually(Duration::from_secs(3), || host_pids_with(&secs).is_empty()).await);
    assert_eq!(f.core.get(&sbx.id).unwrap().running_execs, 0);
}

#[tokio::test]
async fn dropping_an_exec_kills_everything_it_started() {
    let f = fixture().await;
    let sbx = f.create().await;
    let secs = unique_sleep();
    // A background grandchild too: the whole pid namespace must go.
    let script = format!("sleep {secs} & echo $$ > /workspace/pid; sleep {secs}");
    let exec = f.core.exec(exec_req(&sbx.id, &["sh", "-c", &script]));
    let running = eventually(Duration::from_secs(10), || {
        host_pids_with(&format!("sleep {secs}")).len() >= 2
    });
    tokio::select! {
        r = exec => panic!("exec finished early: {r:?}"),
        up = running => assert!(up, "sleeps never started"),
    }
    // The exec future is dropped here, as when a gRPC caller hangs up.
    assert!(
        eventually(Duration::from_secs(3), || host_pids_with(&format!(
            "sleep {secs}"
        ))
        .is_empty())
        .await,
        "sandboxed processes survived the dropped call: {:?}",
        host_pids_with(&secs)
    );
    assert!(
        eventually(Duration::from_secs(2), || f
            .core
            .get(&sbx.id)
            .unwrap()
            .running_execs
            == 0)
        .await
    );
}

#[tokio::test]
async fn destroy_kills_running_commands_and_removes_the_workspace() {
    let f = fixture().await;
    let sbx = f.create().await;
    let secs = unique_sleep();
    let core = f.core.clone();
    let id = sbx.id.clone();
    let script = format!("sleep {secs}");
    let running =
        tokio::spawn(async move { core.exec(exec_req(&id, &["sh", "-c", &script])).await });
    assert!(
        eventually(Duration::from_secs(10), || !host_pids_with(&format!(
            "sleep {secs}"
        ))
        .is_empty())
        .await
    );
    assert_eq!(f.core.get(&sbx.id).unwrap().running_execs, 1);

    let dir = f.state.join("sandboxes").join(&sbx.id);
    assert!(common::own_files(&f.state, &sbx.id).join(".git").is_dir());
    let res = f
        .core
        .destroy(DestroySandboxRequest {
            sandbox_id: sbx.id.clone(),
            reason: "fork finished".into(),
        })
        .await
        .unwrap();
    assert!(res.existed);
    assert!(host_pids_with(&format!("sleep {secs}")).is_empty());
    assert!(!dir.exists());
    let err = tonic::Status::from(running.await.unwrap().unwrap_err());
    assert_eq!(
        err.code(),
        tonic::Code::FailedPrecondition,
        "{}",
        err.message()
    );

    assert_eq!(
        tonic::Status::from(f.core.get(&sbx.id).unwrap_err()).code(),
        tonic::Code::NotFound
    );
    let again = f
        .core
        .destroy(DestroySandboxRequest {
            sandbox_id: sbx.id.clone(),
            reason: String::new(),
        })
        .await
        .unwrap();
    assert!(!again.existed);
    let err = tonic::Status::from(f.core.exec(exec_req(&sbx.id, &["true"])).await.unwrap_err());
    assert_eq!(err.code(), tonic::Code::NotFound);
}

#[tokio::test]
async fn unrestricted_network_is_refused() {
    let f = fixture().await;
    let mut req = f.request("net");
    req.network = true;
    let err = f.core.create(req).await.unwrap_err();
    let status = tonic::Status::from(err);
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(status.message().contains("network"), "{}", status.message());
    let mut req = f.request("net");
    req.egress_allow = vec!["bad host".into()];
    let status = tonic::Status::from(f.core.create(req).await.unwrap_err());
    assert!(
        status.message().contains("egress_allow"),
        "{}",
        status.message()
    );
}

#[tokio::test]
async fn env_values_never_appear_on_a_command_line() {
    let f = fixture().await;
    let sbx = f.create().await;
    let secret = format!("prompt-{}", common::unique_sleep());
    let mut req = exec_req(&sbx.id, &["sleep", "2"]);
    req.env.insert("PROMPT".into(), secret.clone());
    let core = f.core.clone();
    let run = tokio::spawn(async move { core.exec(req).await.unwrap() });
    let started = eventually(Duration::from_secs(10), || {
        !common::host_pids_with(&format!("--bind {}", f.state.display())).is_empty()
            || !common::host_pids_with("sleep 2").is_empty()
    })
    .await;
    assert!(started);
    assert!(
        host_pids_with(&secret).is_empty(),
        "env value visible in a host argv"
    );
    let out = run.await.unwrap();
    assert_eq!(out.exit_code, 0, "{}", out.stderr);
    let out = f.sh(&sbx.id, "echo $FORKYARD_SANDBOX_ID").await;
    assert_eq!(out.stdout.trim(), sbx.id);
}

/// An operator's toolchain (`--toolchains rust=…`) in a home sandboxes' uids cannot pass
/// (0700, like `/root/.rustup`): every sandboxed command finds its `bin` on PATH and reads
/// its files, and cannot write them.
#[tokio::test]
async fn a_toolchain_in_the_operators_home_is_on_every_sandboxs_path_read_only() {
    use std::os::unix::fs::PermissionsExt as _;
    let home = tempfile::tempdir().unwrap();
    std::fs::set_permissions(home.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    let sysroot = home.path().join(".rustup/toolchains/stable");
    std::fs::create_dir_all(sysroot.join("bin")).unwrap();
    std::fs::create_dir_all(sysroot.join("lib")).unwrap();
    std::fs::write(sysroot.join("lib/version"), "1.2.3\n").unwrap();
    let tool = sysroot.join("bin/fakec");
    std::fs::write(
        &tool,
        "#!/bin/sh\ncat \"$(dirname \"$0\")/../lib/version\"\n",
    )
    .unwrap();
    std::fs::set_permissions(&tool, std::fs::Permissions::from_mode(0o755)).unwrap();
    let toolchain = forkyard_sandbox_provisioner::local::isolation::host_tools::Toolchain::parse(
        &format!("fakec={}", sysroot.display()),
    )
    .unwrap();
    let f = common::fixture_with(|_, c| c.toolchains = vec![toolchain]).await;
    let sbx = f.create().await;
    let out = f
        .sh(
            &sbx.id,
            "echo \"$PATH\"; fakec; touch /run/forkyard/toolchains/fakec/lib/x 2>&1 || echo refused",
        )
        .await;
    assert_eq!(out.exit_code, 0, "{out:?}");
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert!(
        lines[0].contains("/run/forkyard/toolchains/fakec/bin:"),
        "{out:?}"
    );
    assert_eq!(lines[1], "1.2.3", "{out:?}");
    assert!(out.stdout.contains("refused"), "{out:?}");
    assert!(!home.path().join(".rustup/toolchains/stable/lib/x").exists());
}
