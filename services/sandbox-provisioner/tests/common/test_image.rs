//! Image archives for tests, made here: a `docker save` archive of one layer holding
//! the host's `dash` as `/bin/sh` (with the libraries it loads, so it runs without
//! anything of the host's /usr), an `/etc/os-release` of its own and `imagetool`, a
//! program no host has. Shared by the provisioner's tests and the end-to-end ones.

#![allow(dead_code)] // each test binary uses a part of it

use sha2::Digest;
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
    let libs = libraries(Path::new("/bin/dash"));
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

/// A layer of only the host's `dash` as `/bin/sh` and its libraries, as a tar.
pub fn shell_layer_tar() -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    shell_layer(&mut b);
    b.into_inner().unwrap()
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
    let layer_path = dir.join(format!("{name}.layer"));
    std::fs::write(&layer_path, &layer).unwrap();
    write_archive(
        dir,
        name,
        &layer_path,
        &[
            "PATH=/usr/local/bin:/usr/bin:/bin",
            "IMAGE_GREETING=from the image",
            "HOME=/root",
        ],
    );
}

/// A `docker save` archive (`<dir>/<name>`) of one layer holding, from this host, the
/// `programs` (with every library they load; `/bin/dash` as `/bin/sh`) and the `trees`
/// (directories, copied whole), plus `links` (`path` → `target`). For a real program in
/// an image without the host's /usr, such as an agent CLI.
pub fn save_image_of(
    dir: &Path,
    name: &str,
    programs: &[&str],
    trees: &[&str],
    links: &[(&str, &str)],
) {
    let layer_path = dir.join(format!("{name}.layer"));
    let mut b = tar::Builder::new(std::fs::File::create(&layer_path).unwrap());
    b.follow_symlinks(false);
    shell_layer_into(&mut b);
    let mut added = std::collections::BTreeSet::new();
    for program in programs {
        for path in std::iter::once(PathBuf::from(program)).chain(libraries(Path::new(program))) {
            let real = std::fs::canonicalize(&path).unwrap();
            let inside = path.strip_prefix("/").unwrap().to_path_buf();
            if added.insert(inside.clone()) {
                b.append_path_with_name(&real, &inside).unwrap();
            }
        }
    }
    for tree in trees {
        b.append_dir_all(tree.trim_start_matches('/'), tree)
            .unwrap();
    }
    for (path, target) in links {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Symlink);
        h.set_size(0);
        h.set_mode(0o777);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(0);
        b.append_link(&mut h, path.trim_start_matches('/'), target)
            .unwrap();
    }
    b.into_inner().unwrap();
    write_archive(
        dir,
        name,
        &layer_path,
        &["PATH=/usr/local/bin:/usr/bin:/bin"],
    );
}

/// The libraries `program` loads, as `ldd` names them.
fn libraries(program: &Path) -> Vec<PathBuf> {
    let ldd = Command::new("ldd").arg(program).output().expect("ldd");
    String::from_utf8_lossy(&ldd.stdout)
        .split_whitespace()
        .filter(|w| w.starts_with('/'))
        .map(PathBuf::from)
        .collect()
}

/// `dash` as `/bin/sh` with its libraries, into a layer written to a file.
fn shell_layer_into(b: &mut tar::Builder<std::fs::File>) {
    b.append_path_with_name("/bin/dash", "bin/sh").unwrap();
    for lib in libraries(Path::new("/bin/dash")) {
        let real = std::fs::canonicalize(&lib).unwrap();
        b.append_path_with_name(&real, lib.strip_prefix("/").unwrap())
            .unwrap();
    }
}

/// A `docker save` archive (`<dir>/<name>`) of `layers` (plain tars, lowest first).
pub fn save_layers(dir: &Path, name: &str, layers: &[Vec<u8>]) {
    let diff_ids: Vec<String> = layers.iter().map(|l| digest(l)).collect();
    let config = serde_json::json!({
        "config": { "Env": ["PATH=/usr/local/bin:/usr/bin:/bin"] },
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
    })
    .to_string();
    let config_name = format!(
        "{}.json",
        digest(config.as_bytes()).trim_start_matches("sha256:")
    );
    let names: Vec<String> = (1..=layers.len())
        .map(|i| format!("l{i}/layer.tar"))
        .collect();
    let manifest =
        serde_json::json!([{"Config": config_name, "RepoTags": ["test:1"], "Layers": names}])
            .to_string();
    let mut out = tar::Builder::new(std::fs::File::create(dir.join(name)).unwrap());
    let files = [
        ("manifest.json".to_owned(), manifest.into_bytes()),
        (config_name, config.into_bytes()),
    ];
    for (path, data) in files.iter().chain(
        names
            .iter()
            .cloned()
            .zip(layers.iter().cloned())
            .collect::<Vec<_>>()
            .iter(),
    ) {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_mtime(0);
        h.set_cksum();
        out.append_data(&mut h, path, data.as_slice()).unwrap();
    }
    out.finish().unwrap();
}

/// The `docker save` archive of the layer at `layer_path` (removed afterwards).
fn write_archive(dir: &Path, name: &str, layer_path: &Path, env: &[&str]) {
    let mut hash = sha2::Sha256::new();
    std::io::copy(&mut std::fs::File::open(layer_path).unwrap(), &mut hash).unwrap();
    let layer_digest = format!("sha256:{:x}", hash.finalize());
    let config = serde_json::json!({
        "config": { "Env": env, "WorkingDir": "/src" },
        "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
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
    out.append_path_with_name(layer_path, "l1/layer.tar")
        .unwrap();
    out.finish().unwrap();
    std::fs::remove_file(layer_path).unwrap();
}
