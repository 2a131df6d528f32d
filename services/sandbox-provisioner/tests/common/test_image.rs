//! Image archives for tests, made here: a `docker save` archive of one layer holding
//! the host's `dash` as `/bin/sh` (with the libraries it loads, so it runs without
//! anything of the host's /usr), an `/etc/os-release` of its own and `imagetool`, a
//! program no host has. Shared by the provisioner's tests and the end-to-end ones.

use sha2::Digest as _;
use std::{
    path::{Path, PathBuf},
    process::Command,
};

fn digest(data: &[u8]) -> String {
    format!("sha256:{:x}", sha2::Sha256::digest(data))
}

/// A layer with the host's `dash` as `/bin/sh` and the libraries it loads, so the image
/// runs on this machine without anything of the host's /usr.
fn shell_layer(b: &mut tar::Builder<Vec<u8>>) {
    let ldd = Command::new("ldd").arg("/bin/dash").output().expect("ldd");
    let libs: Vec<PathBuf> = String::from_utf8_lossy(&ldd.stdout)
        .split_whitespace()
        .filter(|w| w.starts_with('/'))
        .map(PathBuf::from)
        .collect();
    assert!(!libs.is_empty(), "ldd found no libraries of /bin/dash");
    append_file(b, "bin/sh", &std::fs::read("/bin/dash").unwrap(), 0o755);
    for lib in libs {
        let bytes = std::fs::read(&lib).unwrap();
        let inside = lib
            .strip_prefix("/")
            .unwrap()
            .to_string_lossy()
            .into_owned();
        append_file(b, &inside, &bytes, 0o755);
    }
}

fn append_file(b: &mut tar::Builder<Vec<u8>>, path: &str, data: &[u8], mode: u32) {
    let mut h = tar::Header::new_gnu();
    h.set_size(data.len() as u64);
    h.set_mode(mode);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(0);
    h.set_entry_type(tar::EntryType::Regular);
    h.set_cksum();
    b.append_data(&mut h, path, data).unwrap();
}

/// A `docker save` archive (`<dir>/<name>`) of one layer, `with_shell` or without.
pub fn save_image(dir: &Path, name: &str, with_shell: bool) {
    let mut b = tar::Builder::new(Vec::new());
    if with_shell {
        shell_layer(&mut b);
    }
    append_file(&mut b, "etc/os-release", b"ID=forkyard-test-image\n", 0o644);
    append_file(
        &mut b,
        "usr/local/bin/imagetool",
        b"#!/bin/sh\necho \"image tool $IMAGE_GREETING\"\n",
        0o755,
    );
    let layer = b.into_inner().unwrap();
    let config = serde_json::json!({
        "config": {
            "Env": ["PATH=/usr/local/bin:/usr/bin:/bin", "IMAGE_GREETING=from the image", "HOME=/root"],
            "WorkingDir": "/src",
        },
        "rootfs": {"type": "layers", "diff_ids": [digest(&layer)]},
    })
    .to_string();
    let config_name = format!(
        "{}.json",
        digest(config.as_bytes()).trim_start_matches("sha256:")
    );
    let manifest = serde_json::json!([
        {"Config": config_name, "RepoTags": ["test:1"], "Layers": ["l1/layer.tar"]}
    ])
    .to_string();
    let mut out = tar::Builder::new(std::fs::File::create(dir.join(name)).unwrap());
    for (path, data) in [
        ("manifest.json", manifest.as_bytes()),
        (config_name.as_str(), config.as_bytes()),
        ("l1/layer.tar", layer.as_slice()),
    ] {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(0);
        h.set_cksum();
        out.append_data(&mut h, path, data).unwrap();
    }
    out.finish().unwrap();
}
