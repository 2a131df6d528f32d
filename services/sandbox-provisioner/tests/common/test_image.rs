//! Image archives for tests, made here: a `docker save` archive of one layer holding
//! the host's `dash` as `/bin/sh` (with the libraries it loads, so it runs without
//! anything of the host's /usr), an `/etc/os-release` of its own and `imagetool`, a
//! program no host has. Shared by the provisioner's tests and the end-to-end ones.

#![allow(dead_code)] // each test binary uses a part of it

use sha2::Digest;
use std::{
    io::Write,
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
    write_archive(
        dir,
        name,
        &[
            "PATH=/usr/local/bin:/usr/bin:/bin",
            "IMAGE_GREETING=from the image",
            "HOME=/root",
        ],
        |w| w.write_all(&layer),
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
    write_archive(dir, name, &["PATH=/usr/local/bin:/usr/bin:/bin"], |w| {
        let mut b = tar::Builder::new(w);
        b.follow_symlinks(false);
        shell_layer_into(&mut b);
        let mut added = std::collections::BTreeSet::new();
        for program in programs {
            for path in std::iter::once(PathBuf::from(program)).chain(libraries(Path::new(program)))
            {
                let real = std::fs::canonicalize(&path)?;
                let inside = path.strip_prefix("/").unwrap().to_path_buf();
                if added.insert(inside.clone()) {
                    b.append_path_with_name(&real, &inside)?;
                }
            }
        }
        for tree in trees {
            b.append_dir_all(tree.trim_start_matches('/'), tree)?;
        }
        for (path, target) in links {
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(tar::EntryType::Symlink);
            h.set_size(0);
            h.set_mode(0o777);
            h.set_uid(0);
            h.set_gid(0);
            h.set_mtime(0);
            b.append_link(&mut h, path.trim_start_matches('/'), target)?;
        }
        b.finish()
    });
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
fn shell_layer_into<W: Write>(b: &mut tar::Builder<W>) {
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

/// A `docker save` archive (`<dir>/<name>`) of the one layer `layer` writes, streamed
/// into the archive as it is made (an agent CLI's layer is hundreds of MB: no second copy
/// on disk) and hashed on the way; the config naming its digest and the manifest follow
/// it (an archive is read whole, in any order).
fn write_archive(
    dir: &Path,
    name: &str,
    env: &[&str],
    layer: impl FnOnce(&mut Hashing<'_>) -> std::io::Result<()>,
) {
    let mut out = tar::Builder::new(std::fs::File::create(dir.join(name)).unwrap());
    let mut h = tar::Header::new_gnu();
    h.set_mode(0o644);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(0);
    let mut entry = out.append_writer(&mut h, "l1/layer.tar").unwrap();
    let mut hashing = Hashing {
        out: &mut entry,
        hash: sha2::Sha256::new(),
    };
    layer(&mut hashing).unwrap();
    let layer_digest = format!("sha256:{:x}", hashing.hash.finalize());
    entry.finish().unwrap();
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
    for (path, data) in [
        (config_name.as_str(), config.as_bytes()),
        ("manifest.json", manifest.as_bytes()),
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

/// A writer that hashes what passes through it (a layer's digest as it is written).
pub struct Hashing<'a> {
    out: &'a mut dyn Write,
    hash: sha2::Sha256,
}

impl Write for Hashing<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.out.write(buf)?;
        self.hash.update(&buf[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }
}
