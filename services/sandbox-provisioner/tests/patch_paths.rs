//! A patch is the same whichever way it is collected: in steps under the sandbox's init
//! (what it leaves out read on the host), by one script in a bubblewrap per command, or
//! by the script when the workspace's `.git` is not a plain directory.

mod common;

use common::{Fixture, fixture, fixture_with};
use forkyard_proto::sandbox::v1::{CollectPatchRequest, CollectPatchResponse};

/// Changes of every kind, and two files too large for any patch (sparse: 65 MiB long,
/// nothing on disk), one of them with a name a pathspec would read as a pattern.
const CHANGES: &str = "echo changed >> README.md && mkdir -p 'deep/er dir' && \
    echo new > 'deep/er dir/new file.txt' && truncate -s 65M 'big *.bin' && \
    truncate -s 65M deep/huge.img";

async fn patch_of(f: &Fixture, setup: &str) -> CollectPatchResponse {
    let sbx = f.create().await;
    let out = f.sh(&sbx.id, setup).await;
    assert_eq!(out.exit_code, 0, "{}", out.stderr);
    f.core
        .collect_patch(CollectPatchRequest {
            sandbox_id: sbx.id.clone(),
            max_bytes: 0,
            ..Default::default()
        })
        .await
        .unwrap()
}

fn assert_same_changes(p: &CollectPatchResponse) {
    assert!(p.patch.contains("+changed"), "{}", p.patch);
    assert!(
        p.patch.contains("+++ b/deep/er dir/new file.txt"),
        "{}",
        p.patch
    );
    assert!(
        !p.patch.contains(".bin") && !p.patch.contains(".img"),
        "{}",
        p.patch
    );
    let mut skipped = p.skipped_files.clone();
    skipped.sort();
    assert_eq!(skipped, ["big *.bin", "deep/huge.img"]);
}

fn assert_same_patch(p: &CollectPatchResponse) {
    assert_same_changes(p);
    let d = p.diffstat.unwrap();
    assert_eq!((d.files_changed, d.insertions, d.deletions), (2, 2, 0));
}

#[tokio::test]
async fn under_the_init_the_patch_leaves_out_files_too_large_and_names_them() {
    let f = fixture().await;
    assert_same_patch(&patch_of(&f, CHANGES).await);
}

#[tokio::test]
async fn a_bubblewrap_per_command_collects_the_same_patch() {
    let f = fixture_with(|_, config| config.sandbox_init = false).await;
    assert_same_patch(&patch_of(&f, CHANGES).await);
}

#[tokio::test]
async fn a_git_file_in_place_of_the_git_directory_still_gives_the_patch() {
    let f = fixture().await;
    let moved = format!("{CHANGES} && mv .git .realgit && echo 'gitdir: .realgit' > .git");
    let p = patch_of(&f, &moved).await;
    // The moved repository's own files are in the patch too (to git, only a directory
    // named `.git` is not content), as they were before the init ran patches in steps.
    assert_same_changes(&p);
    assert!(p.patch.contains("+++ b/.realgit/HEAD"), "{}", p.patch);
}
