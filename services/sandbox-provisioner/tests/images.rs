//! Sandboxes on an image: the image's root filesystem is the sandbox's `/` (read-only,
//! with the workspace at /workspace and the image's Env), what only the image has can
//! be run, nothing of the host's /usr is visible, and an image that cannot be used is
//! refused naming it, leaving nothing behind.

mod common;

use common::{Fixture, test_image::save_image};
use forkyard_proto::sandbox::v1::{CollectPatchRequest, CreateSandboxRequest};
use forkyard_sandbox_provisioner::error::ProvisionerError;

/// A provisioner with an image directory holding `tool.tar` (runnable) and
/// `no-shell.tar` (no /bin/sh).
async fn fixture() -> Fixture {
    common::fixture_with(|tmp, config| {
        let images = tmp.join("images");
        std::fs::create_dir(&images).unwrap();
        save_image(&images, "tool.tar", true);
        save_image(&images, "no-shell.tar", false);
        config.image_archive_dir = Some(images);
    })
    .await
}

fn on_image(f: &Fixture, image: &str) -> CreateSandboxRequest {
    CreateSandboxRequest {
        image: image.into(),
        ..f.request("forkyard-fork-1")
    }
}

#[tokio::test]
async fn a_sandbox_runs_on_its_image_and_sees_nothing_of_the_hosts_usr() {
    let f = fixture().await;
    let sbx = f
        .core
        .create(on_image(&f, "archive:tool.tar"))
        .await
        .unwrap();
    assert_eq!(sbx.image, "archive:tool.tar");
    assert!(
        sbx.image_digest.starts_with("sha256:"),
        "{}",
        sbx.image_digest
    );

    // Only the image has imagetool; the image's Env reaches the command.
    let out = f.sh(&sbx.id, "imagetool").await;
    assert_eq!(
        (out.exit_code, out.stdout.as_str()),
        (0, "image tool from the image\n"),
        "{}",
        out.stderr
    );
    let script = r#"
        while read -r line; do echo "$line"; done < /etc/os-release
        pwd
        echo "home=$HOME"
        test -e /usr/bin/git && echo "host git visible" || echo "no git"
        test -d /workspace/.git && echo "workspace"
        (echo x > /written) 2>/dev/null && echo "root writable" || echo "root read-only"
        echo change > /workspace/from-image.txt && echo "workspace writable"
    "#;
    let out = f.sh(&sbx.id, script).await;
    assert_eq!(
        out.stdout,
        "ID=forkyard-test-image\n/workspace\nhome=/tmp\nno git\nworkspace\nroot read-only\nworkspace writable\n",
        "{}",
        out.stderr
    );

    // The provisioner's own steps need no git in the image: the patch is collected.
    let patch = f
        .core
        .collect_patch(CollectPatchRequest {
            sandbox_id: sbx.id.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(patch.patch.contains("+change"), "{}", patch.patch);

    // A sandbox without an image still has the host's tools.
    let host = f.create().await;
    let out = f
        .sh(&host.id, "command -v imagetool || git --version")
        .await;
    assert!(out.stdout.starts_with("git version"), "{out:?}");
}

#[tokio::test]
async fn many_sandboxes_of_one_image_share_one_unpacked_copy() {
    let f = fixture().await;
    let creates = (0..8).map(|i| {
        let mut req = on_image(&f, "archive:tool.tar");
        req.branch = format!("forkyard-fork-{i}");
        f.core.create(req)
    });
    let made = futures::future::join_all(creates).await;
    let digests: std::collections::HashSet<String> =
        made.into_iter().map(|s| s.unwrap().image_digest).collect();
    assert_eq!(digests.len(), 1, "{digests:?}");
    let unpacked: Vec<_> = std::fs::read_dir(f.state.join("images"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(unpacked.len(), 1, "{unpacked:?}");
}

#[tokio::test]
async fn an_image_that_cannot_be_used_is_refused_naming_it_and_leaves_nothing() {
    let f = fixture().await;
    for (image, says) in [
        ("archive:missing.tar", "no archive missing.tar"),
        ("archive:no-shell.tar", "no /bin/sh"),
        ("127.0.0.1:9/forkyard/node:22", "cannot be reached"),
    ] {
        match f.core.create(on_image(&f, image)).await {
            Err(ProvisionerError::FailedPrecondition(m)) => {
                assert!(m.contains(image) && m.contains(says), "{image}: {m}");
            }
            other => panic!("{image}: {other:?}"),
        }
    }
    for image in ["archive:../state/sandboxes", "Not An Image"] {
        match f.core.create(on_image(&f, image)).await {
            Err(e @ ProvisionerError::InvalidArgument { field: "image", .. }) => {
                assert!(e.to_string().contains("image"), "{e}");
            }
            other => panic!("{image}: {other:?}"),
        }
    }
    let left = f.sandbox_dirs();
    assert!(left.is_empty(), "{left:?}");
    assert!(f.core.list(&Default::default()).is_empty());
}
