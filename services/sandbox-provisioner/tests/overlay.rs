//! A template's sandbox gets an overlay of the template's workspace (`local::storage::overlay`):
//! what the sandbox sees and may change is its own, what it writes lands in its own
//! layer, the template and the other sandboxes are untouched, and the mount is in no
//! namespace of the host's. Needs root (a uid per sandbox) and Linux 6.15 or later;
//! elsewhere templates are copied and these tests fail under FORKYARD_TEST_STRICT
//! (`make test` on CI), or are skipped and listed.

mod common;

use common::{exec_req, fixture, fixture_with, git};
use forkyard_proto::sandbox::v1::{
    CollectPatchRequest, DestroySandboxRequest, HydrateWorkspaceRequest, PersistWorkspaceRequest,
    ReadFileRequest,
};
use std::path::Path;

/// Whether this host gives overlay workspaces: as root, on Linux 6.15 or later, with the
/// state directory not on overlayfs. Not the provisioner's own probe, so that a probe
/// that broke shows here as a failure, not as every test skipped.
fn overlays_expected() -> bool {
    use forkyard_common::testing::{Need, requires};
    if !requires(
        Need::Overlay,
        rustix::process::geteuid().is_root(),
        "not root: no uid per sandbox, so templates are copied",
    ) {
        return false;
    }
    let release = rustix::system::uname()
        .release()
        .to_string_lossy()
        .into_owned();
    let mut parts = release.split(|c: char| !c.is_ascii_digit());
    let (major, minor) = (
        parts
            .next()
            .and_then(|p| p.parse::<u32>().ok())
            .unwrap_or(0),
        parts
            .next()
            .and_then(|p| p.parse::<u32>().ok())
            .unwrap_or(0),
    );
    if !requires(
        Need::Overlay,
        (major, minor) >= (6, 15),
        &format!("Linux {release}: no clone of a detached mount, so templates are copied"),
    ) {
        return false;
    }
    // An overlay's upper layer cannot be on overlayfs (the state directory of a
    // provisioner in a container whose /tmp is its image's).
    const OVERLAYFS_MAGIC: i64 = 0x794c_7630;
    let tmp = std::env::temp_dir();
    requires(
        Need::Overlay,
        !rustix::fs::statfs(&tmp).is_ok_and(|s| s.f_type == OVERLAYFS_MAGIC),
        &format!("{} is on overlayfs, so templates are copied", tmp.display()),
    )
}

/// Lines of this process's mount table naming `path`.
fn host_mounts_under(path: &Path) -> Vec<String> {
    let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let path = path.display().to_string();
    table
        .lines()
        .filter(|l| l.contains(&path))
        .map(str::to_owned)
        .collect()
}

/// `f`'s provisioner gone and another opened on its state directory: a restart.
async fn restarted(f: common::Fixture) -> common::Fixture {
    let common::Fixture {
        tmp,
        repo,
        state,
        core,
    } = f;
    drop(core);
    let core = common::open(&state).await;
    common::Fixture {
        tmp,
        repo,
        state,
        core,
    }
}

fn template_files(state: &Path, name: &str) -> Vec<String> {
    std::fs::read_dir(state.join("templates"))
        .unwrap()
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("workspace").join(name)).ok())
        .collect()
}

#[tokio::test]
async fn a_sandboxs_overlay_is_its_own_and_leaves_the_template_and_the_others_alone() {
    if !overlays_expected() {
        return;
    }
    let f = fixture().await;
    // A directory in the template, to rename inside a sandbox.
    std::fs::create_dir_all(f.repo.join("src")).unwrap();
    std::fs::write(f.repo.join("src/lib.txt"), "lib\n").unwrap();
    git(&f.repo, &["add", "."]);
    git(&f.repo, &["commit", "-q", "-m", "src"]);
    let a = f.create().await;
    let b = f.core.create(f.request("forkyard-fork-2")).await.unwrap();
    for s in [&a, &b] {
        let dir = f.state.join("sandboxes").join(&s.id);
        assert!(dir.join("upper").is_dir(), "{}: not an overlay", s.id);
        assert_eq!(std::fs::read_dir(dir.join("workspace")).unwrap().count(), 0);
    }
    assert_eq!(host_mounts_under(&f.state), Vec::<String>::new());

    // The template's files are the sandbox's, and it changes them as its own: a write,
    // a new directory, a renamed directory of the template.
    let uid = f.sh(&a.id, "id -u").await.stdout;
    let out = f
        .sh(
            &a.id,
            "stat -c %u README.md src/lib.txt .git/HEAD . && echo more >> README.md \
             && mkdir -p new/dir && echo n > new/dir/f && mv src lib && git branch --show-current",
        )
        .await;
    assert_eq!(out.exit_code, 0, "{}", out.stderr);
    assert_eq!(
        out.stdout,
        format!("{0}{0}{0}{0}forkyard-fork-1\n", uid),
        "{out:?}"
    );
    let read = f
        .core
        .read_file(ReadFileRequest {
            sandbox_id: a.id.clone(),
            path: "README.md".into(),
            max_bytes: 0,
        })
        .await
        .unwrap();
    assert_eq!(read.content, b"hello\nworld\nmore\n");
    let patch = f
        .core
        .collect_patch(CollectPatchRequest {
            sandbox_id: a.id.clone(),
            max_bytes: 0,
            ..Default::default()
        })
        .await
        .unwrap();
    for part in ["+more", "lib/lib.txt", "new/dir/f"] {
        assert!(patch.patch.contains(part), "{part}: {}", patch.patch);
    }
    // What it wrote is in its own layer, its uid's on the host.
    let upper = common::own_files(&f.state, &a.id);
    let meta = std::fs::metadata(upper.join("README.md")).unwrap();
    assert_eq!(
        std::os::unix::fs::MetadataExt::uid(&meta).to_string(),
        uid.trim()
    );

    // The other sandbox and the template are as they were.
    let out = f
        .sh(
            &b.id,
            "cat README.md src/lib.txt && git status --porcelain && git branch --show-current",
        )
        .await;
    assert_eq!(
        out.stdout, "hello\nworld\nlib\nforkyard-fork-2\n",
        "{out:?}"
    );
    let empty = f
        .core
        .collect_patch(CollectPatchRequest {
            sandbox_id: b.id.clone(),
            max_bytes: 0,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(empty.patch, "");
    assert_eq!(template_files(&f.state, "README.md"), ["hello\nworld\n"]);
}

#[tokio::test]
async fn an_overlay_is_mounted_again_after_a_restart_and_goes_with_its_sandbox() {
    if !overlays_expected() {
        return;
    }
    let f = fixture().await;
    let sbx = f.create().await;
    let out = f
        .sh(&sbx.id, "echo kept > kept.txt && echo x >> README.md")
        .await;
    assert_eq!(out.exit_code, 0, "{}", out.stderr);
    let f = restarted(f).await;
    let (core, state) = (&f.core, &f.state);
    let out = core
        .exec(exec_req(&sbx.id, &["sh", "-c", "cat kept.txt README.md"]))
        .await
        .unwrap();
    assert_eq!(out.stdout, "kept\nhello\nworld\nx\n", "{out:?}");
    core.destroy(DestroySandboxRequest {
        sandbox_id: sbx.id.clone(),
        reason: "test".into(),
    })
    .await
    .unwrap();
    assert!(!state.join("sandboxes").join(&sbx.id).exists());
    assert_eq!(host_mounts_under(state), Vec::<String>::new());
    assert_eq!(template_files(state, "README.md"), ["hello\nworld\n"]);
}

#[tokio::test]
async fn with_overlays_off_a_template_is_copied() {
    let f = fixture_with(|_, c| c.workspace_overlay = false).await;
    let sbx = f.create().await;
    let dir = f.state.join("sandboxes").join(&sbx.id);
    assert!(!dir.join("upper").exists());
    assert!(dir.join("workspace/.git").is_dir());
    assert_eq!(
        f.sh(&sbx.id, "cat README.md").await.stdout,
        "hello\nworld\n"
    );
}

/// A repository's new commit makes a new template, and its older one goes unless a live
/// sandbox's overlay stands on it: that sandbox's repository stays whole.
#[tokio::test]
async fn a_template_a_sandbox_stands_on_stays_when_its_repository_moves_on() {
    if !overlays_expected() {
        return;
    }
    let f = fixture().await;
    let a = f.create().await;
    std::fs::write(f.repo.join("README.md"), "next\n").unwrap();
    git(&f.repo, &["commit", "-q", "-am", "next"]);
    let b = f.core.create(f.request("forkyard-fork-2")).await.unwrap();
    assert_ne!(a.base_commit, b.base_commit);
    let templates = std::fs::read_dir(f.state.join("templates"))
        .unwrap()
        .flatten()
        .filter(|t| !t.file_name().to_string_lossy().contains(".tmp-"))
        .count();
    assert_eq!(
        templates, 2,
        "the older template went while a sandbox used it"
    );
    let out = f
        .sh(
            &a.id,
            "git fsck --no-progress && cat README.md && git status --porcelain",
        )
        .await;
    assert_eq!(
        (out.exit_code, out.stdout.as_str()),
        (0, "hello\nworld\n"),
        "{}",
        out.stderr
    );
    assert_eq!(f.sh(&b.id, "cat README.md").await.stdout, "next\n");
}

/// A hydrate puts the snapshot in place of the overlay: the workspace is a plain
/// directory from then on, the overlay's layers are gone, and the disk bound counts it.
#[tokio::test]
async fn a_hydrate_replaces_an_overlay_with_the_snapshot() {
    if !overlays_expected() {
        return;
    }
    let f = fixture().await;
    let sbx = f.create().await;
    f.sh(&sbx.id, "echo v1 > state.txt").await;
    let snap = f
        .core
        .persist(PersistWorkspaceRequest {
            sandbox_id: sbx.id.clone(),
        })
        .await
        .unwrap();
    f.sh(&sbx.id, "echo v2 > state.txt && echo gone > other.txt")
        .await;
    f.core
        .hydrate(HydrateWorkspaceRequest {
            sandbox_id: sbx.id.clone(),
            snapshot_id: snap.snapshot_id,
        })
        .await
        .unwrap();
    let dir = f.state.join("sandboxes").join(&sbx.id);
    assert!(!dir.join("upper").exists(), "the overlay's layer is left");
    assert!(dir.join("workspace/.git").is_dir());
    let out = f
        .sh(
            &sbx.id,
            "cat state.txt README.md; ls other.txt 2>&1; git branch --show-current",
        )
        .await;
    assert_eq!(
        out.stdout,
        "v1\nhello\nworld\nls: cannot access 'other.txt': No such file or directory\nforkyard-fork-1\n"
    );
    // The restart after it finds a plain workspace, as the record now says.
    let f = restarted(f).await;
    let out = f
        .core
        .exec(exec_req(&sbx.id, &["cat", "state.txt"]))
        .await
        .unwrap();
    assert_eq!(out.stdout, "v1\n");
}
