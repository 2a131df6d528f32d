//! Images made to attack the host, pushed to a real registry (Debian's `docker-registry`)
//! byte for byte and named by a create as any caller could: links a lower layer made
//! and then wrote, deleted or emptied through, whiteouts of `..`, hard links to host
//! files, absolute paths, device nodes, setuid files, duplicate entries, layers that
//! are not tars, and bombs. Each is refused (FAILED_PRECONDITION naming the image and
//! the entry) or neutralised, and a canary directory outside the cache, the target of
//! every link, comes through each byte for byte, with nothing of a refused image left.

mod common;

use common::{
    Fixture,
    registry::{RawLayer, Registry, digest, push_raw, start_registry},
    test_image::shell_layer_tar,
};
use forkyard_proto::sandbox::v1::CreateSandboxRequest;
use forkyard_sandbox_provisioner::{error::ProvisionerError, local::storage::image::UnpackLimits};
use std::{
    collections::BTreeMap,
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
    process::Command,
};

/// One tar entry, its names written raw (the tar builder refuses the hostile ones).
enum T<'a> {
    File(&'a str, &'a [u8], u32),
    Dir(&'a str),
    Sym(&'a str, &'a str),
    Hard(&'a str, &'a str),
    /// A character (false) or block (true) device.
    Dev(&'a str, bool),
}

fn tar(entries: &[T<'_>]) -> Vec<u8> {
    let mut out = Vec::new();
    for e in entries {
        let mut h = tar::Header::new_gnu();
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(1_700_000_000);
        h.set_mode(0o755);
        h.set_size(0);
        let (path, link, data): (&str, &str, &[u8]) = match e {
            T::File(p, d, mode) => {
                h.set_mode(*mode);
                h.set_size(d.len() as u64);
                (p, "", d)
            }
            T::Dir(p) => {
                h.set_entry_type(tar::EntryType::Directory);
                (p, "", &[])
            }
            T::Sym(p, to) => {
                h.set_entry_type(tar::EntryType::Symlink);
                (p, to, &[])
            }
            T::Hard(p, to) => {
                h.set_entry_type(tar::EntryType::Link);
                (p, to, &[])
            }
            T::Dev(p, block) => {
                h.set_entry_type(if *block {
                    tar::EntryType::Block
                } else {
                    tar::EntryType::Char
                });
                h.set_device_major(if *block { 8 } else { 1 }).unwrap();
                h.set_device_minor(if *block { 0 } else { 3 }).unwrap();
                (p, "", &[])
            }
        };
        let g = h.as_gnu_mut().unwrap();
        g.name[..path.len()].copy_from_slice(path.as_bytes());
        g.linkname[..link.len()].copy_from_slice(link.as_bytes());
        h.set_cksum();
        out.extend_from_slice(h.as_bytes());
        out.extend_from_slice(data);
        out.resize(out.len().div_ceil(512) * 512, 0);
    }
    out.resize(out.len() + 1024, 0);
    out
}

/// The tree under `dir` as it is: every entry's kind, mode, owner, size, content and
/// link target.
fn fingerprint(dir: &Path) -> BTreeMap<PathBuf, String> {
    let mut out = BTreeMap::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(p) = todo.pop() {
        let m = std::fs::symlink_metadata(&p).unwrap();
        let what = if m.is_symlink() {
            format!("link {}", std::fs::read_link(&p).unwrap().display())
        } else if m.is_dir() {
            todo.extend(std::fs::read_dir(&p).unwrap().map(|e| e.unwrap().path()));
            "dir".into()
        } else {
            digest(&std::fs::read(&p).unwrap())
        };
        let key = p.strip_prefix(dir).unwrap().to_path_buf();
        out.insert(
            key,
            format!("{what} {:o} {}:{} {}", m.mode(), m.uid(), m.gid(), m.len()),
        );
    }
    out
}

struct Corpus {
    f: Fixture,
    registry: Registry,
    _reg_dir: tempfile::TempDir,
    /// Outside the state directory: what every hostile link names.
    canary: PathBuf,
    before: BTreeMap<PathBuf, String>,
}

async fn corpus(limits: UnpackLimits) -> Corpus {
    let f = common::fixture_with(|_, c| c.image_limits = limits).await;
    let reg_dir = tempfile::tempdir().unwrap();
    let registry = start_registry(reg_dir.path());
    let canary = f.tmp.path().join("canary");
    std::fs::create_dir_all(canary.join("sub/deeper")).unwrap();
    std::fs::write(canary.join("keep"), "the host's file\n").unwrap();
    std::fs::write(canary.join("sub/deep"), "another\n").unwrap();
    std::fs::write(canary.join("sub/deeper/deepest"), "and another\n").unwrap();
    let before = fingerprint(f.tmp.path().join("canary").as_path());
    Corpus {
        f,
        registry,
        _reg_dir: reg_dir,
        canary,
        before,
    }
}

impl Corpus {
    fn c(&self) -> &str {
        self.canary.to_str().unwrap()
    }

    /// Push `layers` over a shell layer as `hostile/<name>:1` and create a sandbox on it.
    async fn create(
        &self,
        name: &str,
        layers: Vec<RawLayer>,
    ) -> (String, Result<String, ProvisionerError>) {
        let mut all = vec![RawLayer::tar(shell_layer_tar())];
        all.extend(layers);
        push_raw(&self.registry, &format!("hostile/{name}"), "1", &all).await;
        let image = format!("{}/hostile/{name}:1", self.registry.addr);
        let made = self
            .f
            .core
            .create(CreateSandboxRequest {
                image: image.clone(),
                ..self.f.request(&format!("fork-{name}"))
            })
            .await
            .map(|s| s.id);
        (image, made)
    }

    fn canary_intact(&self, case: &str) {
        assert_eq!(
            fingerprint(&self.canary),
            self.before,
            "{case}: the canary changed"
        );
    }

    /// Refused naming the image and `says`, with no sandbox, staging or image left.
    async fn refused(&self, name: &str, layers: Vec<RawLayer>, says: &[&str]) {
        let (image, made) = self.create(name, layers).await;
        match made {
            Err(ProvisionerError::FailedPrecondition(m)) => {
                assert!(m.contains(&image), "{name}: {m}");
                for s in says {
                    assert!(m.contains(s), "{name}: {m} (wanted {s:?})");
                }
            }
            other => panic!("{name}: {other:?}"),
        }
        self.canary_intact(name);
        assert!(self.f.sandbox_dirs().is_empty(), "{name}");
        let images = self.images();
        assert!(images.is_empty(), "{name}: the cache kept {images:?}");
    }

    /// What the image cache holds (published images and staging).
    fn images(&self) -> Vec<std::ffi::OsString> {
        std::fs::read_dir(self.f.state.join("images"))
            .map(|d| d.flatten().map(|e| e.file_name()).collect())
            .unwrap_or_default()
    }
}

const ROOMY: UnpackLimits = UnpackLimits {
    bytes: 256 << 20,
    entries: 10_000,
};

#[tokio::test]
async fn links_made_by_a_lower_layer_never_lead_a_write_or_a_deletion_out() {
    let k = corpus(ROOMY).await;
    let c = k.c().to_owned();
    let link = |name: &'static str, to: String| RawLayer::tar(tar(&[T::Sym(name, &to)]));
    let through = ["runs through a symbolic link"];
    // layer 1: evil -> canary; layer 2: a whiteout through it.
    k.refused(
        "whiteout",
        vec![
            link("evil", c.clone()),
            RawLayer::tar(tar(&[T::File("evil/.wh.keep", b"", 0o644)])),
        ],
        &["evil", through[0]],
    )
    .await;
    k.refused(
        "opaque",
        vec![
            link("evil", c.clone()),
            RawLayer::tar(tar(&[T::File("evil/.wh..wh..opq", b"", 0o644)])),
        ],
        &["evil", through[0]],
    )
    .await;
    k.refused(
        "opaque-deeper",
        vec![
            link("evil", c.clone()),
            RawLayer::tar(tar(&[T::File("evil/sub/.wh..wh..opq", b"", 0o644)])),
        ],
        &through,
    )
    .await;
    k.refused(
        "dotdot-whiteout",
        vec![
            link("evil", format!("{c}/sub")),
            RawLayer::tar(tar(&[T::File("evil/.wh...", b"", 0o644)])),
        ],
        &["whiteout"],
    )
    .await;
    // One layer: the link, then a file, a directory or a hard link through it.
    k.refused(
        "link-then-file",
        vec![RawLayer::tar(tar(&[
            T::Sym("evil3", &c),
            T::File("evil3/keep", b"pwned", 0o644),
        ]))],
        &["evil3", through[0]],
    )
    .await;
    k.refused(
        "link-then-dir",
        vec![RawLayer::tar(tar(&[
            T::Sym("evil4", &c),
            T::Dir("evil4/made/"),
        ]))],
        &through,
    )
    .await;
    k.refused(
        "hardlink-through-link",
        vec![RawLayer::tar(tar(&[
            T::Sym("evil5", &c),
            T::Hard("stolen", "evil5/keep"),
        ]))],
        &through,
    )
    .await;
    // A directory replaced by a link in the same layer, then written through.
    k.refused(
        "dir-then-link",
        vec![RawLayer::tar(tar(&[
            T::Dir("d/"),
            T::Sym("d", &c),
            T::File("d/x", b"pwned", 0o644),
        ]))],
        &through,
    )
    .await;
}

#[tokio::test]
async fn hard_links_to_host_paths_climbs_and_non_tars_are_refused() {
    let k = corpus(ROOMY).await;
    let c = k.c().to_owned();
    let keep = format!("{c}/keep");
    k.refused(
        "hardlink-host",
        vec![RawLayer::tar(tar(&[T::Hard("stolen", &keep)]))],
        &["no such entry"],
    )
    .await;
    k.refused(
        "hardlink-climb",
        vec![RawLayer::tar(tar(&[T::Hard(
            "stolen",
            "../../../../../../../etc/passwd",
        )]))],
        &["climbs out"],
    )
    .await;
    k.refused(
        "climb",
        vec![RawLayer::tar(tar(&[T::File(
            "../../../../../../tmp/escaped",
            b"x",
            0o644,
        )]))],
        &["climbs out"],
    )
    .await;
    k.refused(
        "not-a-tar",
        vec![RawLayer::tar(
            b"#!/bin/sh\nthis is no tar at all, nor gzip\n".repeat(40),
        )],
        &["not a tar"],
    )
    .await;
    let lying = RawLayer {
        stored: tar(&[T::File("etc/x", b"x", 0o644)]),
        diff_id: digest(b"something else"),
    };
    k.refused("diff-id", vec![lying], &["digest mismatch"])
        .await;
    assert!(!Path::new("/tmp/escaped").exists());
}

#[tokio::test]
async fn absolute_paths_devices_setuid_bits_and_duplicates_are_neutralised() {
    let k = corpus(ROOMY).await;
    let abs = format!("{}/abs", k.c());
    let layer = tar(&[
        T::File(&abs, b"inside the image\n", 0o644),
        T::Dev("dev-null2", false),
        T::Dev("dev-sda", true),
        T::File("usr/bin/rootme", b"#!/bin/sh\nid\n", 0o4755),
        T::Dir("shared/"),
        T::File("shared/dup", b"one\n", 0o644),
        T::File("shared/dup", b"two\n", 0o644),
        T::Dir("x/"),
        T::File("x", b"a file now\n", 0o644),
        T::Sym("etc-shadow", "/etc/shadow"),
    ]);
    let (image, made) = k.create("neutral", vec![RawLayer::tar(layer)]).await;
    let id = made.unwrap_or_else(|e| panic!("{image}: {e:?}"));
    // The image has only dash: its builtins read the files.
    let script = String::from(
        "r() { while IFS= read -r l; do echo \"$l\"; done < \"$1\"; }; r /shared/dup; r /x; \
         for d in /dev-null2 /dev-sda; do test -e $d && echo \"$d is there\"; done; echo done",
    );
    let out = k.f.sh(&id, &script).await;
    assert_eq!(out.stdout, "two\na file now\ndone\n", "{}", out.stderr);
    k.canary_intact("neutral");
    // In the cache on the host: no setuid bit, no device node, the link kept as a link.
    let rootfs = std::fs::read_dir(k.f.state.join("images"))
        .unwrap()
        .flatten()
        .map(|e| e.path().join("rootfs"))
        .find(|p| p.is_dir())
        .unwrap();
    let m = |p: &str| std::fs::symlink_metadata(rootfs.join(p));
    assert_eq!(m("usr/bin/rootme").unwrap().mode() & 0o7777, 0o755);
    assert!(m("dev-null2").is_err() && m("dev-sda").is_err());
    assert!(m("etc-shadow").unwrap().is_symlink());
    // The absolute path landed inside the image (a sandbox's /tmp is its own tmpfs, so
    // it is read here).
    let inside = rootfs.join(abs.trim_start_matches('/'));
    assert_eq!(std::fs::read(inside).unwrap(), b"inside the image\n");
}

/// A gzip of `header` then `zeros` zero bytes and the tar's end, made by the real gzip
/// (the test build's deflate is unoptimised).
fn gzip_bomb(dir: &Path, zeros: u64) -> Vec<u8> {
    let mut h = tar::Header::new_gnu();
    h.set_path("bomb").unwrap();
    h.set_size(zeros);
    h.set_mode(0o644);
    h.set_cksum();
    let header = dir.join("bomb-header");
    std::fs::write(&header, h.as_bytes()).unwrap();
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "(cat {}; head -c {} /dev/zero) | gzip -1",
            header.display(),
            zeros + 1024
        ))
        .output()
        .unwrap();
    assert!(out.status.success());
    out.stdout
}

#[tokio::test]
async fn a_gzip_bomb_and_an_entry_bomb_stop_at_the_bound_and_leave_nothing() {
    let k = corpus(UnpackLimits {
        bytes: 64 << 20,
        entries: 5_000,
    })
    .await;
    let bomb = gzip_bomb(k.f.tmp.path(), 2 << 30);
    assert!(bomb.len() < 16 << 20, "a bomb: {} bytes", bomb.len());
    // Its diff_id is never reached: the bound stops the read first.
    let layer = RawLayer {
        stored: bomb,
        diff_id: digest(b"2 GiB of zeros"),
    };
    k.refused("gzip-bomb", vec![layer], &["FORKYARD_IMAGE_MAX_BYTES"])
        .await;
    let names: Vec<String> = (0..6_000).map(|i| format!("f{i}")).collect();
    let many: Vec<T<'_>> = names.iter().map(|n| T::File(n, b"", 0o644)).collect();
    k.refused(
        "entry-bomb",
        vec![RawLayer::tar(tar(&many))],
        &["FORKYARD_IMAGE_MAX_ENTRIES"],
    )
    .await;
}

/// A registry that answers every manifest with `manifest` and every blob with
/// `pwned`, recording the paths asked for.
async fn lying_registry(
    manifest: String,
) -> (String, std::sync::Arc<std::sync::Mutex<Vec<String>>>) {
    use axum::{http::Uri, response::IntoResponse};
    let asked = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = asked.clone();
    let app = axum::Router::new().fallback(move |uri: Uri| {
        let (seen, manifest) = (seen.clone(), manifest.clone());
        async move {
            seen.lock().unwrap().push(uri.path().to_owned());
            if uri.path().contains("/manifests/") {
                (
                    [("content-type", "application/vnd.oci.image.manifest.v1+json")],
                    manifest,
                )
                    .into_response()
            } else {
                "pwned".into_response()
            }
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (addr, asked)
}

#[tokio::test]
async fn a_registry_naming_a_path_for_a_digest_gets_nothing_written_or_fetched() {
    let k = corpus(ROOMY).await;
    let keep = format!("{}/keep", k.c());
    for (n, evil) in [
        format!("sha256:{keep}"),
        format!("sha256:../../../../../../../..{keep}"),
    ]
    .into_iter()
    .enumerate()
    {
        let config = format!("sha256:{}", "0".repeat(64));
        let manifest = serde_json::json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config, "size": 5},
            "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": evil, "size": 5}],
        })
        .to_string();
        let (addr, asked) = lying_registry(manifest).await;
        let image = format!("{addr}/evil/paths:{n}");
        let made =
            k.f.core
                .create(CreateSandboxRequest {
                    image: image.clone(),
                    ..k.f.request("digest-path")
                })
                .await;
        match made {
            Err(ProvisionerError::FailedPrecondition(m)) => {
                assert!(
                    m.contains(&image) && m.contains("unsupported digest"),
                    "{m}"
                );
            }
            other => panic!("{evil}: {other:?}"),
        }
        let blobs: Vec<_> = asked
            .lock()
            .unwrap()
            .iter()
            .filter(|p| p.contains("/blobs/"))
            .cloned()
            .collect();
        assert!(blobs.is_empty(), "fetched {blobs:?}");
        k.canary_intact(&evil);
        assert!(k.images().is_empty());
    }
}
