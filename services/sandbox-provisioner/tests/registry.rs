//! Images pulled from a real OCI registry (Debian's `docker-registry`, the CNCF
//! distribution registry) that the test pushes to with `skopeo`: a sandbox runs on the
//! pulled image, twenty sandboxes asking at once pull it once, and a missing image or a
//! registry that is down is refused naming the image, leaving nothing behind.

mod common;

use common::{Fixture, test_image::save_image};
use forkyard_proto::sandbox::v1::CreateSandboxRequest;
use forkyard_sandbox_provisioner::error::ProvisionerError;
use std::{
    net::TcpListener,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

/// `docker-registry serve` on a free loopback port, storing in a temp dir, its log in
/// `<dir>/registry.log`.
struct Registry {
    child: Child,
    addr: String,
    log: PathBuf,
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn start_registry(dir: &Path) -> Registry {
    let addr = format!("127.0.0.1:{}", free_port());
    let config = dir.join("registry.yml");
    std::fs::write(
        &config,
        format!(
            "version: 0.1\nlog:\n  level: info\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: {addr}\n",
            dir.join("data").display()
        ),
    )
    .unwrap();
    let log = dir.join("registry.log");
    let child = Command::new("docker-registry")
        .args(["serve", config.to_str().unwrap()])
        .stdout(Stdio::from(std::fs::File::create(&log).unwrap()))
        .stderr(Stdio::from(
            std::fs::File::options().append(true).open(&log).unwrap(),
        ))
        .spawn()
        .expect("docker-registry (Debian package docker-registry; make deps installs it)");
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(&addr).is_err() {
        assert!(
            Instant::now() < deadline,
            "the registry did not start: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    Registry { child, addr, log }
}

/// Push the `docker save` archive `archive` as `<registry>/<name>`; its manifest digest.
fn push(registry: &Registry, archive: &Path, name: &str) -> String {
    let dest = format!("docker://{}/{name}", registry.addr);
    let out = Command::new("skopeo")
        .args(["copy", "--quiet", "--dest-tls-verify=false"])
        .arg(format!("docker-archive:{}", archive.display()))
        .arg(&dest)
        .output()
        .expect("skopeo (Debian package skopeo; make deps installs it)");
    assert!(
        out.status.success(),
        "skopeo copy: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = Command::new("skopeo")
        .args(["inspect", "--tls-verify=false", "--format", "{{.Digest}}"])
        .arg(&dest)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "skopeo inspect: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

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
