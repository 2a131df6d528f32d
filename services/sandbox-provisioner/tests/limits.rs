//! Cgroup limits: processes, memory, and destroy by cgroup. This host runs cgroup v1
//! (root); on a host without writable cgroups these tests fail under
//! FORKYARD_TEST_STRICT (`make test` on CI) and are skipped and listed otherwise.

mod common;

use common::{eventually, exec_req, fixture};
use forkyard_common::testing::Need;
use forkyard_proto::sandbox::v1::{DestroySandboxRequest, SandboxLimits};
use std::time::Duration;

fn cgroups_writable() -> bool {
    let ok = forkyard_sandbox_provisioner::local::isolation::cgroup::Cgroups::detect(
        "forkyard-test-probe",
    )
    .is_ok();
    forkyard_common::testing::requires(Need::Cgroups, ok, "a sandbox's cgroup limits")
}

#[tokio::test]
async fn a_fork_bomb_is_capped_by_pids_max() {
    if !cgroups_writable() {
        return;
    }
    let f = fixture().await;
    let mut req = f.request("forkyard-fork-1");
    req.limits = Some(SandboxLimits {
        pids: 32,
        ..Default::default()
    });
    let sbx = f.core.create(req).await.unwrap();
    assert_eq!(sbx.limits.unwrap().pids, 32);
    // Records how many background processes it managed to start; the shell dies at the
    // first fork the pids controller refuses.
    let script = "i=0; while [ $i -lt 200 ]; do sleep 30 & i=$((i+1)); echo $i > n; done";
    let out = f.sh(&sbx.id, script).await;
    assert_ne!(out.exit_code, 0, "{out:?}");
    assert!(out.stderr.to_lowercase().contains("fork"), "{out:?}");
    let out = f.sh(&sbx.id, "cat n").await;
    let count: u32 = out
        .stdout
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("{out:?}"));
    assert!(count < 32, "{count} processes in a sandbox capped at 32");
    assert!(count >= 10, "the cap is not absurdly low: {count}");
}

#[tokio::test]
async fn a_memory_hog_is_oom_killed() {
    if !cgroups_writable() {
        return;
    }
    let f = fixture().await;
    let mut req = f.request("forkyard-fork-1");
    req.limits = Some(SandboxLimits {
        memory_bytes: 64 << 20,
        ..Default::default()
    });
    let sbx = f.core.create(req).await.unwrap();
    // `tail` keeps the whole (newline-free) line in memory: 512 MiB of it.
    let out = f
        .sh(&sbx.id, "head -c 536870912 /dev/zero | tail -n 1 | wc -c")
        .await;
    assert!(out.oom_killed, "{out:?}");
    assert!(out.stderr.contains("Killed"), "{out:?}");
    // The sandbox still works afterwards.
    let out = f.sh(&sbx.id, "echo alive").await;
    assert_eq!(out.stdout, "alive\n");
    assert!(!out.oom_killed);
}

#[tokio::test]
async fn destroy_kills_every_process_of_the_cgroup_including_escapees() {
    if !cgroups_writable() {
        return;
    }
    let f = fixture().await;
    let sbx = f.create().await;
    let marker = common::unique_sleep();
    // One sleeper in a new session (out of the exec's process group), one in the foreground.
    let script = format!("setsid nohup sleep {marker} >/dev/null 2>&1 & sleep {marker}");
    let mut req = exec_req(&sbx.id, &["sh", "-c", &script]);
    req.timeout_secs = 30;
    let core = f.core.clone();
    let exec = tokio::spawn(async move { core.exec(req).await });
    assert!(
        eventually(Duration::from_secs(10), || common::host_pids_with(&marker)
            .len()
            >= 2)
        .await,
        "sleepers did not start"
    );
    f.core
        .destroy(DestroySandboxRequest {
            sandbox_id: sbx.id.clone(),
            reason: "test".into(),
        })
        .await
        .unwrap();
    assert!(
        common::host_pids_with(&marker).is_empty(),
        "processes survived destroy"
    );
    let leftovers: Vec<_> = std::fs::read_dir("/sys/fs/cgroup/pids/forkyard")
        .into_iter()
        .flatten()
        .flatten()
        .filter(|d| d.path().join(&sbx.id).exists())
        .collect();
    assert!(leftovers.is_empty(), "cgroup of the destroyed sandbox kept");
    let _ = exec.await;
}

#[tokio::test]
async fn workspace_over_its_disk_limit_is_flagged() {
    let f = fixture().await;
    let mut req = f.request("forkyard-fork-1");
    req.limits = Some(SandboxLimits {
        disk_bytes: 4 << 20,
        ..Default::default()
    });
    let sbx = f.core.create(req).await.unwrap();
    let out = f.sh(&sbx.id, "echo small > s.txt").await;
    assert!(!out.workspace_over_limit);
    let out = f
        .sh(&sbx.id, "head -c 8388608 /dev/urandom > big.bin")
        .await;
    assert!(out.workspace_over_limit, "{out:?}");
    let got = f.core.get(&sbx.id).unwrap();
    assert!(got.workspace_over_limit && got.workspace_bytes > 4 << 20);
}

#[tokio::test]
async fn a_sandbox_past_its_ttl_is_destroyed_by_the_provisioner() {
    let tmp = common::let_through(tempfile::tempdir().unwrap());
    let repo = common::make_repo(tmp.path());
    let state = tmp.path().join("state");
    let mut config = forkyard_sandbox_provisioner::Config::new(&state, "http://x");
    config.reap_interval = Duration::from_millis(200);
    let core = forkyard_sandbox_provisioner::Provisioner::open(config)
        .await
        .unwrap();
    let mut req = forkyard_proto::sandbox::v1::CreateSandboxRequest {
        repo: repo.display().to_string(),
        branch: "b".into(),
        ttl_secs: 1,
        ..Default::default()
    };
    let short = core.create(req.clone()).await.unwrap();
    assert!(short.expires_unix_ms > short.created_unix_ms);
    req.ttl_secs = 3600;
    let long = core.create(req).await.unwrap();
    let dir = state.join("sandboxes").join(&short.id);
    assert!(
        eventually(Duration::from_secs(10), || !dir.exists()
            && core.get(&short.id).is_err())
        .await,
        "expired sandbox kept"
    );
    assert!(core.get(&long.id).is_ok());
}

#[tokio::test]
async fn a_sandbox_counts_its_cpu_and_memory_time_and_prices_them() {
    let f = common::fixture().await;
    let sbx = f.create().await;
    let before = f.core.get(&sbx.id).unwrap().usage.unwrap_or_default();
    assert_eq!(
        (before.cpu_ms, before.memory_mib_seconds, before.cost_micros),
        (0, 0, 0)
    );
    // Two seconds of the shell's own CPU (user + system ticks from its `stat`, read with
    // builtins only), holding a few MiB: CPU time, not wall time, so a loaded machine
    // only makes it take longer.
    let out = f
        .sh(
            &sbx.id,
            "x=$(head -c 8000000 /dev/zero | tr '\\0' a); while read -r s < /proc/$$/stat; set -- $s; [ $((${14} + ${15})) -lt 200 ]; do :; done; echo ${#x}",
        )
        .await;
    assert_eq!(out.exit_code, 0, "{}", out.stderr);
    let u = f.core.get(&sbx.id).unwrap().usage.unwrap_or_default();
    assert!(u.cpu_ms >= 1500, "{u:?}");
    assert!(u.memory_mib_seconds >= 1, "{u:?}");
    let prices = forkyard_sandbox_provisioner::usage::Prices::default();
    assert_eq!(u.cost_micros, prices.local(u.cpu_ms, u.memory_mib_seconds));
    assert!(u.cost_micros > 0);
    // The patch's collection reports the same, and never less.
    let patch = f
        .core
        .collect_patch(forkyard_proto::sandbox::v1::CollectPatchRequest {
            sandbox_id: sbx.id.clone(),
            max_bytes: 0,
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(patch.usage.unwrap_or_default().cost_micros >= u.cost_micros);
}

/// Where `parent` is in each cgroup hierarchy of this host (v1: one per controller).
fn group_dirs(parent: &str) -> Vec<std::path::PathBuf> {
    let root = std::path::Path::new("/sys/fs/cgroup");
    std::fs::read_dir(root)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join(parent))
        .chain([root.join(parent)])
        .filter(|d| d.is_dir())
        .collect()
}

/// A provisioner that goes (its last handle dropped, as when its process ends after the
/// drain) leaves no cgroup on the host, even with a process still running in a sandbox:
/// no one else ever removes its groups (their parent is named for its state directory),
/// and every group left makes each CPU-limit write on the host dearer.
#[tokio::test]
async fn a_provisioner_that_goes_leaves_no_cgroup_behind() {
    if !cgroups_writable() {
        return;
    }
    let f = fixture().await;
    let sbx = f.core.create(f.request("forkyard-fork-1")).await.unwrap();
    let out = f
        .sh(&sbx.id, "sleep 300 >/dev/null 2>&1 & echo started")
        .await;
    assert_eq!(out.stdout.trim(), "started", "{out:?}");
    let parent = forkyard_sandbox_provisioner::local::isolation::cgroup::instance_parent(
        "forkyard", &f.state,
    );
    let before = group_dirs(&parent);
    assert!(
        before.iter().any(|d| d.join(&sbx.id).is_dir()),
        "the sandbox's group under {parent}: {before:?}"
    );
    let common::Fixture { core, tmp, .. } = f;
    drop(core);
    assert_eq!(group_dirs(&parent), Vec::<std::path::PathBuf>::new());
    drop(tmp);
}

/// What the caller asked for: 1 TiB of memory and of disk, a million processes,
/// a lifetime ending in 2163. Each is over the operator's maximum, refused naming its
/// field before anything is made; at the maximum a sandbox is made.
#[tokio::test]
async fn a_create_past_the_operators_maxima_is_refused_naming_the_field() {
    let f = fixture().await;
    let tib = 1u64 << 40;
    for (field, limits, ttl_secs) in [
        (
            "limits.memory_bytes",
            SandboxLimits {
                memory_bytes: tib,
                ..Default::default()
            },
            0,
        ),
        (
            "limits.disk_bytes",
            SandboxLimits {
                disk_bytes: tib,
                ..Default::default()
            },
            0,
        ),
        (
            "limits.pids",
            SandboxLimits {
                pids: 1_000_000,
                ..Default::default()
            },
            0,
        ),
        ("ttl_secs", SandboxLimits::default(), u32::MAX),
    ] {
        let mut req = f.request("forkyard-fork-1");
        req.limits = Some(limits);
        req.ttl_secs = ttl_secs;
        let status = tonic::Status::from(f.core.create(req).await.unwrap_err());
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{field}");
        assert!(
            status.message().contains(field),
            "{field}: {}",
            status.message()
        );
    }
    assert!(
        std::fs::read_dir(f.state.join("sandboxes"))
            .unwrap()
            .next()
            .is_none(),
        "a refused create left a sandbox"
    );
    let max = forkyard_sandbox_provisioner::maxima::Maxima::DEFAULT;
    let mut req = f.request("forkyard-fork-1");
    req.limits = Some(SandboxLimits {
        pids: max.pids,
        ..Default::default()
    });
    req.ttl_secs = max.ttl_secs;
    f.core.create(req).await.expect("a create at the maxima");
}
