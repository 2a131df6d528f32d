//! When every file of a workspace is tracked, its patch is one `git diff` of the
//! worktree, without `git add`; it must be what staging everything and diffing the
//! index gives. And a new workspace's index is fresh: git need hash no file to know it
//! is unchanged.

mod common;

use common::Fixture;
use common::fixture;
use forkyard_proto::sandbox::v1::{CollectPatchRequest, DestroySandboxRequest};

/// What an agent did, by name. The repository has README.md ("hello\nworld\n") and
/// old.txt.
const CHANGES: &[(&str, &str)] = &[
    ("nothing", "true"),
    (
        "a same-size edit at once",
        "printf 'HELLO\\nworld\\n' > README.md",
    ),
    ("a deletion", "rm old.txt"),
    ("a mode change", "chmod +x old.txt"),
    (
        "a file made a link",
        "rm old.txt && ln -s README.md old.txt",
    ),
    ("a rename by git", "git mv old.txt moved.txt"),
    (
        "a file git added and changed after",
        "echo a > added.txt && git add added.txt && echo b >> added.txt",
    ),
    ("a binary file", "printf '\\000\\001\\002\\n' > README.md"),
    (
        "an untracked file too",
        "echo n > new.txt && echo more >> README.md",
    ),
];

#[tokio::test]
async fn every_kind_of_change_gives_the_patch_of_everything_staged() {
    let f = fixture().await;
    for (i, (what, change)) in CHANGES.iter().enumerate() {
        let sbx = f
            .core
            .create(f.request(&format!("forkyard-fork-{i}")))
            .await
            .unwrap();
        let out = f.sh(&sbx.id, change).await;
        assert_eq!(out.exit_code, 0, "{what}: {}", out.stderr);
        let p = f
            .core
            .collect_patch(CollectPatchRequest {
                sandbox_id: sbx.id.clone(),
                max_bytes: 0,
                ..Default::default()
            })
            .await
            .unwrap();
        let staged = f
            .sh(
                &sbx.id,
                &format!(
                    "git add -A && git diff --cached --binary --no-color --no-ext-diff {} --",
                    p.base_commit
                ),
            )
            .await;
        assert_eq!(staged.exit_code, 0, "{what}: {}", staged.stderr);
        assert_eq!(p.patch, staged.stdout, "{what}");
        let files = p.diffstat.unwrap().files_changed;
        if *what == "nothing" {
            assert!(p.patch.is_empty() && files == 0, "{what}: {}", p.patch);
        } else {
            assert!(!p.patch.is_empty() && files > 0, "{what}");
        }
        destroy(&f, &sbx.id).await;
    }
}

#[tokio::test]
async fn a_new_workspace_needs_no_file_hashed() {
    let f = fixture().await;
    for _ in 0..2 {
        let sbx = f.create().await;
        // What the patch's git checks (only what a copy keeps) finds nothing to hash...
        let fresh = f
            .sh(
                &sbx.id,
                "git -c core.checkStat=minimal -c core.trustctime=false diff-files --name-only",
            )
            .await;
        assert_eq!(
            (fresh.exit_code, fresh.stdout.as_str()),
            (0, ""),
            "{}",
            fresh.stderr
        );
        // ...where git's full checks see every file of the copy as touched.
        let touched = f.sh(&sbx.id, "git diff-files --name-only").await;
        assert_eq!(touched.stdout, "README.md\nold.txt\n");
        destroy(&f, &sbx.id).await;
    }
}

async fn destroy(f: &Fixture, id: &str) {
    f.core
        .destroy(DestroySandboxRequest {
            sandbox_id: id.to_owned(),
            ..Default::default()
        })
        .await
        .unwrap();
}
