//! `isolation: gvisor` with what a sandbox is held to and what it runs on: its cgroup
//! limits (gVisor's kernel and everything in it are in the sandbox's cgroups), an
//! image's root filesystem, stop and start, a PTY.

mod common;

use common::{exec_req, fixture, fixture_with, test_image::save_image};
use forkyard_common::testing::{Need, requires};
use forkyard_proto::sandbox::v1::{
    CollectPatchRequest, CreateSandboxRequest, SandboxLimits, StartSandboxRequest,
    StopSandboxRequest,
};
use std::path::Path;

fn has_runsc() -> bool {
    let found = Path::new("/usr/bin/runsc").exists() || Path::new("/usr/sbin/runsc").exists();
    requires(Need::Installed("runsc"), found, "gVisor sandboxes")
}

fn cgroups_writable() -> bool {
    let ok = forkyard_sandbox_provisioner::local::isolation::cgroup::Cgroups::detect(
        "forkyard-test-probe",
    )
    .is_ok();
    requires(Need::Cgroups, ok, "a sandbox's cgroup limits")
}

fn gvisor(mut req: CreateSandboxRequest) -> CreateSandboxRequest {
    req.isolation = "gvisor".into();
    req
}

#[tokio::test]
async fn a_memory_hog_in_gvisor_is_oom_killed_and_the_sandbox_comes_back() {
    if !has_runsc() || !cgroups_writable() {
        return;
    }
    let f = fixture().await;
    let mut req = gvisor(f.request("forkyard-fork-1"));
    req.limits = Some(SandboxLimits {
        memory_bytes: 256 << 20,
        ..Default::default()
    });
    let sbx = f.core.create(req).await.unwrap();
    let out = f.sh(&sbx.id, "echo before > kept.txt").await;
    assert_eq!(out.exit_code, 0, "{out:?}");
    // 1 GiB held by `tail`, four times the sandbox's memory.
    let out = f
        .sh(&sbx.id, "head -c 1073741824 /dev/zero | tail -n 1 | wc -c")
        .await;
    assert!(out.oom_killed, "{out:?}");
    assert_ne!(out.exit_code, 0, "{out:?}");
    // The sandbox works again (its kernel started anew when the OOM kill took it), its
    // workspace as it was.
    let out = f.sh(&sbx.id, "cat kept.txt; dmesg | head -1").await;
    assert!(
        out.stdout.starts_with("before\n") && out.stdout.contains("gVisor"),
        "{out:?}"
    );
    assert!(!out.oom_killed, "{out:?}");
}

#[tokio::test]
async fn a_fork_bomb_in_gvisor_is_capped() {
    if !has_runsc() || !cgroups_writable() {
        return;
    }
    let f = fixture().await;
    let mut req = gvisor(f.request("forkyard-fork-1"));
    req.limits = Some(SandboxLimits {
        pids: 128,
        ..Default::default()
    });
    let sbx = f.core.create(req).await.unwrap();
    // Records how many background processes it started; the shell stops at the first
    // fork gVisor's kernel refuses, and the sandbox goes on.
    let script = "i=0; while [ $i -lt 400 ]; do sleep 30 & i=$((i+1)); echo $i > n; done";
    let mut exec = exec_req(&sbx.id, &["sh", "-c", script]);
    exec.timeout_secs = 60;
    let out = f.core.exec(exec).await.unwrap();
    assert_ne!(out.exit_code, 0, "{out:?}");
    assert!(out.stderr.to_lowercase().contains("fork"), "{out:?}");
    let n = f.sh(&sbx.id, "cat n").await;
    let count: u32 = n.stdout.trim().parse().unwrap_or_else(|_| panic!("{n:?}"));
    assert!(count < 128, "{count} processes in a sandbox capped at 128");
    assert!(count >= 64, "the cap is not absurdly low: {count}");
}

#[tokio::test]
async fn a_gvisor_sandbox_runs_on_its_image_and_its_patch_is_collected() {
    if !has_runsc() {
        return;
    }
    let f = fixture_with(|tmp, config| {
        let images = tmp.join("images");
        std::fs::create_dir(&images).unwrap();
        save_image(&images, "tool.tar", true);
        config.image_archive_dir = Some(images);
    })
    .await;
    let mut req = gvisor(f.request("forkyard-fork-1"));
    req.image = "archive:tool.tar".into();
    let sbx = f.core.create(req).await.unwrap();
    let script = r#"
        imagetool
        while read -r line; do echo "$line"; done < /etc/os-release
        test -e /usr/bin/git && echo "host git visible" || echo "no git"
        (echo x > /written) 2>/dev/null && echo "root writable" || echo "root read-only"
        echo change > /workspace/from-image.txt && echo "workspace writable"
    "#;
    let out = f.sh(&sbx.id, script).await;
    assert_eq!(
        out.stdout,
        "image tool from the image\nID=forkyard-test-image\nno git\nroot read-only\nworkspace writable\n",
        "{out:?}"
    );
    let patch = f
        .core
        .collect_patch(CollectPatchRequest {
            sandbox_id: sbx.id.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(patch.patch.contains("+change"), "{}", patch.patch);
}

#[tokio::test]
async fn a_stopped_gvisor_sandbox_starts_again_with_its_workspace() {
    if !has_runsc() {
        return;
    }
    let f = fixture().await;
    let sbx = f
        .core
        .create(gvisor(f.request("forkyard-fork-1")))
        .await
        .unwrap();
    let marker = common::unique_sleep();
    let mut bg = exec_req(
        &sbx.id,
        &["sh", "-c", &format!("echo kept > k.txt; sleep {marker}")],
    );
    bg.timeout_secs = 60;
    let core = f.core.clone();
    let running = tokio::spawn(async move { core.exec(bg).await });
    tokio::time::sleep(std::time::Duration::from_millis(800)).await;
    f.core
        .stop(StopSandboxRequest {
            sandbox_id: sbx.id.clone(),
        })
        .await
        .unwrap();
    let out = running.await.unwrap();
    assert!(
        out.is_err() || out.as_ref().unwrap().exit_code != 0,
        "{out:?}"
    );
    f.core
        .start(StartSandboxRequest {
            sandbox_id: sbx.id.clone(),
        })
        .await
        .unwrap();
    let out = f
        .sh(&sbx.id, "cat k.txt; ps -e -o comm | grep -cx sleep || true")
        .await;
    assert_eq!(
        out.stdout, "kept\n0\n",
        "the stop killed the command: {out:?}"
    );
}
