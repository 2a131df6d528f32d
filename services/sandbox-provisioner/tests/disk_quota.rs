//! The hard disk quota, on a real btrfs (a loop-mounted image with quotas enabled):
//! a sandbox's directory is a subvolume limited to its disk bound plus a margin, so an
//! agent writing past its bound is refused by the kernel, not only stopped by the watch.
mod common;

use forkyard_proto::sandbox::v1::{DestroySandboxRequest, SandboxLimits};
use forkyard_sandbox_provisioner::{
    Config, Provisioner,
    local::{storage::disk_quota::QuotaMode, storage::store},
};
use std::{path::Path, process::Command, time::Duration};

/// A btrfs image mounted under a temp dir; unmounted when dropped.
struct Btrfs {
    mnt: std::path::PathBuf,
    _tmp: tempfile::TempDir,
}

impl Btrfs {
    fn new(quotas: bool) -> Self {
        let tmp = common::let_through(tempfile::tempdir().unwrap());
        let (img, mnt) = (tmp.path().join("fs.img"), tmp.path().join("mnt"));
        std::fs::create_dir(&mnt).unwrap();
        std::fs::File::create(&img)
            .unwrap()
            .set_len(1 << 30)
            .unwrap();
        run("mkfs.btrfs", &["-q".as_ref(), img.as_os_str()]);
        run(
            "mount",
            &[
                "-o".as_ref(),
                "loop".as_ref(),
                img.as_os_str(),
                mnt.as_os_str(),
            ],
        );
        if quotas {
            run(
                "btrfs",
                &["quota".as_ref(), "enable".as_ref(), mnt.as_os_str()],
            );
        }
        common::let_through_dir(&mnt);
        Self { mnt, _tmp: tmp }
    }
}

impl Drop for Btrfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
    }
}

fn run(prog: &str, args: &[&std::ffi::OsStr]) -> String {
    let out = Command::new(prog).args(args).output().expect(prog);
    assert!(
        out.status.success(),
        "{prog} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

async fn open(state: &Path, mode: QuotaMode) -> Result<std::sync::Arc<Provisioner>, String> {
    let mut config = Config::new(state, "http://127.0.0.1:50052");
    config.disk_quota = mode;
    config.exec_timeout = Duration::from_secs(60);
    Provisioner::open(config).await
}

fn root() -> bool {
    forkyard_common::testing::requires(
        forkyard_common::testing::Need::Root,
        rustix::process::geteuid().is_root(),
        "btrfs quotas (and mounting a btrfs)",
    )
}

#[tokio::test]
async fn a_sandbox_on_btrfs_cannot_write_past_its_quota_and_others_are_untouched() {
    if !root() {
        return;
    }
    let fs = Btrfs::new(true);
    let repo = common::make_repo(&fs.mnt);
    let state = fs.mnt.join("state");
    let core = open(&state, QuotaMode::Required)
        .await
        .expect("open with quotas");
    let mut req = forkyard_proto::sandbox::v1::CreateSandboxRequest {
        repo: repo.display().to_string(),
        branch: "forkyard-fork-1".into(),
        limits: Some(SandboxLimits {
            disk_bytes: 64 << 20,
            ..Default::default()
        }),
        ..Default::default()
    };
    let small = core.create(req.clone()).await.unwrap();
    req.limits = None;
    let other = core.create(req).await.unwrap();
    let dir = state.join("sandboxes").join(&small.id);
    let show = run(
        "btrfs",
        &["subvolume".as_ref(), "show".as_ref(), dir.as_os_str()],
    );
    assert!(show.contains(&small.id), "{show}");
    let sh = |id: &str, script: &str| core.exec(common::exec_req(id, &["sh", "-c", script]));

    // More than the quota in one allocation: refused whole (by the file-size limit every
    // sandbox has, before the quota sees it), nothing lands on disk.
    let out = sh(&small.id, "fallocate -l 1G big").await.unwrap();
    assert_ne!(out.exit_code, 0);
    assert!(
        out.stderr.contains("quota") || out.stderr.contains("File size limit exceeded"),
        "{}",
        out.stderr
    );
    assert!(store::disk_usage(&dir) < 8 << 20);

    // Written as fast as it goes: stopped at the wall (the bound and its margin), the
    // crossing of the bound reported.
    let out = sh(
        &small.id,
        "dd if=/dev/zero of=big bs=1M count=400 conv=fsync",
    )
    .await
    .unwrap();
    assert_ne!(out.exit_code, 0, "{}", out.stderr);
    assert!(out.workspace_over_limit, "{out:?}");
    let used = store::disk_usage(&dir);
    let wall = forkyard_sandbox_provisioner::local::storage::disk_quota::hard_limit(64 << 20);
    assert!(
        used > 64 << 20 && used <= wall + (1 << 20),
        "{used} of {wall}"
    );

    // Many files, each within the file-size limit: the quota bounds their sum.
    let out = sh(
        &small.id,
        "rm -f big; for i in 1 2 3 4; do dd if=/dev/zero of=f$i bs=1M count=40 conv=fsync || exit 1; done",
    )
    .await
    .unwrap();
    assert_ne!(
        out.exit_code, 0,
        "four files of 40 MiB fit a 64 MiB quota: {out:?}"
    );
    assert!(store::disk_usage(&dir) <= wall + (1 << 20));

    // The quota is the sandbox's own: its neighbour (the 10 GiB default) writes on.
    let out = sh(
        &other.id,
        "dd if=/dev/zero of=big bs=1M count=200 && echo ok",
    )
    .await
    .unwrap();
    assert_eq!(out.exit_code, 0, "{}", out.stderr);

    // Destroy takes the subvolume with it.
    core.destroy(DestroySandboxRequest {
        sandbox_id: small.id.clone(),
        ..Default::default()
    })
    .await
    .unwrap();
    assert!(
        common::eventually(Duration::from_secs(10), || {
            let list = run(
                "btrfs",
                &["subvolume".as_ref(), "list".as_ref(), fs.mnt.as_os_str()],
            );
            !list.contains(&small.id) && !dir.exists()
        })
        .await,
        "subvolume of the destroyed sandbox kept"
    );
}

#[tokio::test]
async fn without_quotas_enabled_auto_runs_on_the_watch_and_required_refuses_to_start() {
    if !root() {
        return;
    }
    let fs = Btrfs::new(false);
    let state = fs.mnt.join("state");
    let err = open(&state, QuotaMode::Required)
        .await
        .err()
        .expect("refused");
    assert!(err.contains("FORKYARD_SANDBOX_DISK_QUOTA"), "{err}");
    assert!(err.contains("btrfs quota enable"), "{err}");

    let repo = common::make_repo(&fs.mnt);
    let core = open(&state, QuotaMode::Auto).await.expect("auto opens");
    let sbx = core
        .create(forkyard_proto::sandbox::v1::CreateSandboxRequest {
            repo: repo.display().to_string(),
            branch: "b".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let dir = state.join("sandboxes").join(&sbx.id);
    let show = Command::new("btrfs")
        .args(["subvolume", "show"])
        .arg(&dir)
        .output()
        .unwrap();
    assert!(!show.status.success(), "a plain directory, not a subvolume");
}
