//! Images pulled from a real OCI registry (Debian's `docker-registry`, the CNCF
//! distribution registry) that the test pushes to with `skopeo`: a sandbox runs on the
//! pulled image, twenty sandboxes asking at once pull it once, and a missing image or a
//! registry that is down is refused naming the image, leaving nothing behind.

mod common;

use common::{
    Fixture,
    registry::{free_port, push, start_registry},
    test_image::save_image,
};
use forkyard_common::allowed_hosts::AllowedHosts;
use forkyard_proto::sandbox::v1::CreateSandboxRequest;
use forkyard_sandbox_provisioner::{config::REGISTRIES_SETTING, error::ProvisionerError};

fn on_image(f: &Fixture, image: &str, branch: &str) -> CreateSandboxRequest {
    CreateSandboxRequest {
        image: image.into(),
        ..f.request(branch)
    }
}

#[tokio::test]
async fn sandboxes_run_on_an_image_pulled_once_from_a_registry() {
    let f = common::fixture().await;
    let reg_dir = tempfile::tempdir().unwrap();
    let registry = start_registry(reg_dir.path());
    save_image(reg_dir.path(), "tool.tar", true);
    let digest = push(
        &registry,
        &reg_dir.path().join("tool.tar"),
        "forkyard/tool:1",
    );
    let image = format!("{}/forkyard/tool:1", registry.addr);

    let creates = (0..20).map(|i| {
        f.core
            .create(on_image(&f, &image, &format!("forkyard-fork-{i}")))
    });
    let made: Vec<_> = futures::future::join_all(creates)
        .await
        .into_iter()
        .map(|r| r.expect("create on a pulled image"))
        .collect();
    for sbx in &made {
        assert_eq!(sbx.image_digest, digest);
    }
    let out = f.sh(&made[0].id, "imagetool").await;
    assert_eq!(out.stdout, "image tool from the image\n", "{}", out.stderr);

    // One pull: the registry served the manifest and each blob (config and layer) to
    // the provisioner once.
    let log = std::fs::read_to_string(&registry.log).unwrap();
    let ours = |what: &str| {
        log.lines()
            .filter(|l| l.contains(what) && l.ends_with("\"forkyard-sandbox-provisioner\""))
            .count()
    };
    assert_eq!(ours("\"GET /v2/forkyard/tool/manifests/"), 1, "{log}");
    assert_eq!(ours("\"GET /v2/forkyard/tool/blobs/sha256:"), 2, "{log}");

    // By digest, too.
    let by_digest = format!("{}/forkyard/tool@{digest}", registry.addr);
    let sbx = f
        .core
        .create(on_image(&f, &by_digest, "by-digest"))
        .await
        .unwrap();
    assert_eq!(sbx.image_digest, digest);
}

#[tokio::test]
async fn a_missing_image_or_a_registry_that_is_down_is_refused_naming_the_image() {
    let f = common::fixture().await;
    let reg_dir = tempfile::tempdir().unwrap();
    let registry = start_registry(reg_dir.path());
    let down = format!("127.0.0.1:{}", free_port());
    for (image, says) in [
        (
            format!("{}/forkyard/nothing:1", registry.addr),
            "has no forkyard/nothing:1",
        ),
        (format!("{down}/forkyard/tool:1"), "cannot be reached"),
    ] {
        match f.core.create(on_image(&f, &image, "x")).await {
            Err(ProvisionerError::FailedPrecondition(m)) => {
                assert!(m.contains(&image) && m.contains(says), "{image}: {m}");
            }
            other => panic!("{image}: {other:?}"),
        }
    }
    let left = f.sandbox_dirs();
    assert!(left.is_empty(), "{left:?}");
    let staging: Vec<_> = std::fs::read_dir(f.state.join("images"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert!(staging.is_empty(), "{staging:?}");
}

#[tokio::test]
async fn an_image_larger_than_the_cache_is_refused_before_its_layers_are_fetched() {
    let f = common::fixture_with(|_, c| c.image_cache_max_bytes = 4096).await;
    let reg_dir = tempfile::tempdir().unwrap();
    let registry = start_registry(reg_dir.path());
    save_image(reg_dir.path(), "tool.tar", true);
    push(
        &registry,
        &reg_dir.path().join("tool.tar"),
        "forkyard/big:1",
    );
    let image = format!("{}/forkyard/big:1", registry.addr);
    match f.core.create(on_image(&f, &image, "x")).await {
        Err(ProvisionerError::FailedPrecondition(m)) => {
            assert!(
                m.contains(&image) && m.contains("FORKYARD_IMAGE_CACHE_MAX_BYTES"),
                "{m}"
            );
        }
        other => panic!("{other:?}"),
    }
    let log = std::fs::read_to_string(&registry.log).unwrap();
    let blobs = log
        .lines()
        .filter(|l| l.contains("/blobs/sha256:") && l.ends_with("\"forkyard-sandbox-provisioner\""))
        .count();
    assert_eq!(blobs, 0, "{log}");
    assert!(f.sandbox_dirs().is_empty());
}

/// A create names the image, so the registry: one on the provisioner's own loopback (or
/// any other internal address) is refused unless the operator lists it, whether named by
/// its address or by a name that resolves there, with nothing asked of it and the same
/// answer as a registry that is down; a registry the list does not name is refused by
/// name.
#[tokio::test]
async fn registries_on_internal_addresses_are_refused_unless_listed() {
    let reg_dir = tempfile::tempdir().unwrap();
    let registry = start_registry(reg_dir.path());
    save_image(reg_dir.path(), "tool.tar", true);
    push(
        &registry,
        &reg_dir.path().join("tool.tar"),
        "forkyard/tool:1",
    );
    let port = registry.addr.rsplit_once(':').unwrap().1;
    let by_address = format!("{}/forkyard/tool:1", registry.addr);
    let by_name = format!("localhost:{port}/forkyard/tool:1");
    let allowing = |list: &[&str]| {
        let list: Vec<String> = list.iter().map(|s| (*s).to_owned()).collect();
        AllowedHosts::parse(REGISTRIES_SETTING, &list).unwrap()
    };
    let refused_alike = |result: Result<_, ProvisionerError>, image: &str| match result {
        Err(ProvisionerError::FailedPrecondition(m)) => {
            let host = image.split('/').next().unwrap();
            assert_eq!(
                m,
                format!("image {image}: registry: {host} cannot be reached")
            );
        }
        other => panic!("{image}: {other:?}"),
    };

    // The default: any registry whose addresses are public.
    let f = common::fixture_with(|_, c| c.registry.allowed = allowing(&[])).await;
    for image in [&by_address, &by_name] {
        refused_alike(f.core.create(on_image(&f, image, "x")).await, image);
    }
    let log = std::fs::read_to_string(&registry.log).unwrap();
    assert!(
        !log.lines()
            .any(|l| l.ends_with("\"forkyard-sandbox-provisioner\"")),
        "the provisioner asked a registry it may not reach: {log}"
    );

    // Listed by address: pulled. A name that resolves to it is not listed, and is
    // refused by name, saying where the operator lists registries.
    let f = common::fixture_with(|_, c| c.registry.allowed = allowing(&[&registry.addr])).await;
    f.core
        .create(on_image(&f, &by_address, "listed"))
        .await
        .unwrap();
    match f.core.create(on_image(&f, &by_name, "x")).await {
        Err(ProvisionerError::FailedPrecondition(m)) => {
            assert!(m.contains("FORKYARD_ALLOWED_REGISTRIES"), "{m}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(f.sandbox_dirs().len(), 1);
}
