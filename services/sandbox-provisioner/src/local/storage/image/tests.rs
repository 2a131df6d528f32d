//! Image archives made here, byte for byte as the OCI image spec and `docker save`
//! lay them out, loaded into a real cache on disk.

use super::*;
use crate::local::storage::store;
use sha2::Digest as _;
use std::{os::unix::fs::PermissionsExt as _, sync::Arc};

enum E<'a> {
    Dir(&'a str),
    File(&'a str, &'a [u8], u32),
    Link(&'a str, &'a str),
}

fn tar_of(entries: &[E<'_>]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for e in entries {
        let mut h = tar::Header::new_gnu();
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(1_700_000_000);
        match e {
            E::Dir(p) => {
                h.set_entry_type(tar::EntryType::Directory);
                h.set_mode(0o755);
                h.set_size(0);
                b.append_data(&mut h, p, std::io::empty()).unwrap();
            }
            E::File(p, data, mode) => {
                h.set_mode(*mode);
                h.set_size(data.len() as u64);
                b.append_data(&mut h, p, *data).unwrap();
            }
            E::Link(p, to) => {
                h.set_entry_type(tar::EntryType::Symlink);
                h.set_size(0);
                b.append_link(&mut h, p, to).unwrap();
            }
        }
    }
    b.into_inner().unwrap()
}

/// A tar whose entry path is written raw (the builder refuses `..`).
fn tar_with_raw_path(path: &str) -> Vec<u8> {
    let mut h = tar::Header::new_old();
    h.as_old_mut().name[..path.len()].copy_from_slice(path.as_bytes());
    h.set_mode(0o644);
    h.set_size(1);
    h.set_cksum();
    let mut out = h.as_bytes().to_vec();
    out.push(b'x');
    out.resize(1024 + 512 * 2, 0);
    out
}

fn gzip(data: &[u8]) -> Vec<u8> {
    use std::io::Write as _;
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(data).unwrap();
    gz.finish().unwrap()
}

fn digest(data: &[u8]) -> String {
    format!("sha256:{:x}", sha2::Sha256::digest(data))
}

/// An OCI layout in `dir` with `layers` (uncompressed tars; the first stored gzipped).
fn oci_layout(dir: &Path, layers: &[Vec<u8>]) -> String {
    let blobs = dir.join("blobs/sha256");
    std::fs::create_dir_all(&blobs).unwrap();
    let put = |data: &[u8]| {
        let d = digest(data);
        std::fs::write(blobs.join(d.trim_start_matches("sha256:")), data).unwrap();
        d
    };
    let mut descs = Vec::new();
    for (i, l) in layers.iter().enumerate() {
        let stored = if i == 0 { gzip(l) } else { l.clone() };
        let media = if i == 0 { "tar+gzip" } else { "tar" };
        descs.push(serde_json::json!({
            "mediaType": format!("application/vnd.oci.image.layer.v1.{media}"),
            "digest": put(&stored), "size": stored.len(),
        }));
    }
    let config = serde_json::json!({
        "architecture": "amd64", "os": "linux",
        "config": {"Env": ["PATH=/usr/bin", "LANG=C.UTF-8"], "WorkingDir": "/work"},
        "rootfs": {"type": "layers", "diff_ids": layers.iter().map(|l| digest(l)).collect::<Vec<_>>()},
    })
    .to_string();
    let config_digest = put(config.as_bytes());
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config_digest, "size": config.len()},
        "layers": descs,
    })
    .to_string();
    let manifest_digest = put(manifest.as_bytes());
    std::fs::write(dir.join("oci-layout"), r#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
    std::fs::write(
        dir.join("index.json"),
        serde_json::json!({"schemaVersion": 2, "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": manifest_digest, "size": manifest.len()}]})
        .to_string(),
    )
    .unwrap();
    manifest_digest
}

/// The directory `dir` as a tar file next to it.
fn tar_dir(dir: &Path) -> PathBuf {
    let out = dir.with_extension("tar");
    let mut b = tar::Builder::new(std::fs::File::create(&out).unwrap());
    b.append_dir_all(".", dir).unwrap();
    b.finish().unwrap();
    out
}

fn base_and_change() -> Vec<Vec<u8>> {
    let base = tar_of(&[
        E::Dir("usr/"),
        E::Dir("usr/bin/"),
        E::File("usr/bin/tool", b"#!/bin/sh\necho base\n", 0o755),
        E::File("usr/bin/su", b"root me", 0o4755),
        E::Dir("etc/"),
        E::File("etc/old", b"old", 0o644),
        E::Dir("opt/"),
        E::File("opt/a", b"a", 0o644),
        E::File("opt/b", b"b", 0o644),
        E::Dir("lib/"),
        E::Dir("lib/dir-then-file/"),
        E::File("lib/dir-then-file/x", b"x", 0o644),
    ]);
    let change = tar_of(&[
        E::File("etc/.wh.old", b"", 0o644),
        E::File("etc/new", b"new", 0o644),
        E::File("opt/c", b"c", 0o644),
        E::File("opt/.wh..wh..opq", b"", 0o644),
        E::File("lib/dir-then-file", b"now a file", 0o644),
        E::Link("usr/bin/sh-link", "tool"),
    ]);
    vec![base, change]
}

fn cache(tmp: &Path) -> ImageCache {
    ImageCache::open(&tmp.join("images")).unwrap()
}

/// Nothing published and no staging left in the cache under `tmp`.
fn assert_cache_empty(tmp: &Path) {
    let left: Vec<_> = std::fs::read_dir(tmp.join("images"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

#[tokio::test]
async fn an_oci_archive_is_unpacked_with_its_whiteouts_and_without_setuid_bits() {
    let tmp = tempfile::tempdir().unwrap();
    let layout = tmp.path().join("img");
    let manifest_digest = oci_layout(&layout, &base_and_change());
    let archive = tar_dir(&layout);
    let img = cache(tmp.path()).load_archive(&archive).await.unwrap();
    assert_eq!(img.digest, manifest_digest);
    assert_eq!(img.config.env, ["PATH=/usr/bin", "LANG=C.UTF-8"]);
    assert_eq!(img.config.working_dir, "/work");
    let r = &img.rootfs;
    assert_eq!(
        std::fs::read_to_string(r.join("usr/bin/tool")).unwrap(),
        "#!/bin/sh\necho base\n"
    );
    assert!(
        !r.join("etc/old").exists(),
        "a whiteout deletes from the layer below"
    );
    assert_eq!(std::fs::read(r.join("etc/new")).unwrap(), b"new");
    // Opaque: the layer below's opt/a and opt/b are gone, this layer's opt/c stays
    // (though it came before the marker in the tar).
    let mut opt: Vec<_> = std::fs::read_dir(r.join("opt"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    opt.sort();
    assert_eq!(opt, ["c"]);
    assert_eq!(
        std::fs::read(r.join("lib/dir-then-file")).unwrap(),
        b"now a file"
    );
    assert_eq!(
        std::fs::read_link(r.join("usr/bin/sh-link")).unwrap(),
        Path::new("tool")
    );
    let mode = std::fs::metadata(r.join("usr/bin/su"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o7777, 0o755, "setuid dropped");
    assert!(!r.join(".wh.old").exists() && !r.join("etc/.wh.old").exists());

    // The same layout given as a directory is the same image, from the cache.
    let again = cache(tmp.path()).load_archive(&layout).await.unwrap();
    assert_eq!(again, img);
}

#[tokio::test]
async fn a_hundred_loads_of_one_archive_unpack_it_once() {
    let tmp = tempfile::tempdir().unwrap();
    let layout = tmp.path().join("img");
    oci_layout(&layout, &base_and_change());
    let archive = tar_dir(&layout);
    let cache = Arc::new(cache(tmp.path()));
    let loads: Vec<_> = (0..100)
        .map(|_| {
            let (c, a) = (cache.clone(), archive.clone());
            tokio::spawn(async move { c.load_archive(&a).await })
        })
        .collect();
    let mut images = Vec::new();
    for l in loads {
        images.push(l.await.unwrap().unwrap());
    }
    assert!(images.windows(2).all(|w| w[0] == w[1]));
    // One unpacked image; no staging left behind.
    let entries: Vec<_> = std::fs::read_dir(tmp.path().join("images"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(entries.len(), 1, "{entries:?}");
    assert_eq!(cache.loaded.lock().unwrap().len(), 1);
}

#[tokio::test]
async fn a_layer_that_is_not_what_its_digest_says_is_refused_and_nothing_is_kept() {
    let tmp = tempfile::tempdir().unwrap();
    let layout = tmp.path().join("img");
    let layers = base_and_change();
    oci_layout(&layout, &layers);
    // The second layer's blob swapped for other bytes (the blob's own name then lies).
    let bad = digest(&layers[1]);
    let blob = layout
        .join("blobs/sha256")
        .join(bad.trim_start_matches("sha256:"));
    std::fs::write(&blob, tar_of(&[E::File("etc/evil", b"x", 0o644)])).unwrap();
    let err = cache(tmp.path()).load_archive(&layout).await.unwrap_err();
    assert!(
        matches!(&err, ImageError::DigestMismatch { expected, .. } if *expected == bad),
        "{err}"
    );
    assert_cache_empty(tmp.path());
}

#[tokio::test]
async fn an_uncompressed_layer_that_differs_from_its_diff_id_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let layout = tmp.path().join("img");
    let layers = base_and_change();
    oci_layout(&layout, &layers);
    // Rewrite the config's second diff_id (and re-address config and manifest): the
    // blob matches its descriptor, its content not the config.
    let index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(layout.join("index.json")).unwrap()).unwrap();
    let blob = |d: &str| {
        layout
            .join("blobs/sha256")
            .join(d.trim_start_matches("sha256:"))
    };
    let md = index["manifests"][0]["digest"].as_str().unwrap().to_owned();
    let mut manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(blob(&md)).unwrap()).unwrap();
    let cd = manifest["config"]["digest"].as_str().unwrap().to_owned();
    let mut config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(blob(&cd)).unwrap()).unwrap();
    config["rootfs"]["diff_ids"][1] = serde_json::Value::String(digest(b"something else"));
    let config = config.to_string();
    std::fs::write(blob(&digest(config.as_bytes())), &config).unwrap();
    manifest["config"]["digest"] = serde_json::Value::String(digest(config.as_bytes()));
    let manifest = manifest.to_string();
    std::fs::write(blob(&digest(manifest.as_bytes())), &manifest).unwrap();
    std::fs::write(
        layout.join("index.json"),
        serde_json::json!({"manifests": [{"digest": digest(manifest.as_bytes())}]}).to_string(),
    )
    .unwrap();
    let err = cache(tmp.path()).load_archive(&layout).await.unwrap_err();
    assert!(
        matches!(err, ImageError::DigestMismatch { ref what, .. } if what.starts_with("layer")),
        "{err}"
    );
    assert_cache_empty(tmp.path());
}

#[tokio::test]
async fn a_layer_entry_that_climbs_out_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let layout = tmp.path().join("img");
    oci_layout(&layout, &[tar_with_raw_path("../../escaped")]);
    let err = cache(tmp.path()).load_archive(&layout).await.unwrap_err();
    assert!(
        matches!(&err, ImageError::Refused(m) if m.contains("climbs out")),
        "{err}"
    );
    assert!(!tmp.path().join("escaped").exists());
}

#[tokio::test]
async fn a_docker_save_archive_is_an_image_named_by_its_config() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("saved");
    std::fs::create_dir_all(dir.join("l1")).unwrap();
    let layer = tar_of(&[E::Dir("bin/"), E::File("bin/hello", b"hi", 0o755)]);
    std::fs::write(dir.join("l1/layer.tar"), &layer).unwrap();
    let config = serde_json::json!({
        "config": {"Env": null, "WorkingDir": ""},
        "rootfs": {"type": "layers", "diff_ids": [digest(&layer)]},
    })
    .to_string();
    let cd = digest(config.as_bytes());
    let name = format!("{}.json", cd.trim_start_matches("sha256:"));
    std::fs::write(dir.join(&name), &config).unwrap();
    std::fs::write(
        dir.join("manifest.json"),
        serde_json::json!([{"Config": name, "RepoTags": ["t:1"], "Layers": ["l1/layer.tar"]}])
            .to_string(),
    )
    .unwrap();
    let img = cache(tmp.path())
        .load_archive(&tar_dir(&dir))
        .await
        .unwrap();
    assert_eq!(img.digest, cd);
    assert!(img.config.env.is_empty());
    assert_eq!(std::fs::read(img.rootfs.join("bin/hello")).unwrap(), b"hi");

    // A config that is not what its name says is refused.
    std::fs::write(dir.join(&name), config.replace("layers", "LAYERS")).unwrap();
    let err = cache(tmp.path()).load_archive(&dir).await.unwrap_err();
    assert!(matches!(err, ImageError::DigestMismatch { .. }), "{err}");
}

#[tokio::test]
async fn what_is_not_an_image_is_named_so_and_staging_never_survives_a_restart() {
    let tmp = tempfile::tempdir().unwrap();
    let junk = tmp.path().join("junk.tar");
    std::fs::write(&junk, tar_of(&[E::File("readme", b"hello", 0o644)])).unwrap();
    let err = cache(tmp.path()).load_archive(&junk).await.unwrap_err();
    assert!(
        matches!(&err, ImageError::NotAnImage(m) if m.contains("index.json")),
        "{err}"
    );
    let text = tmp.path().join("text");
    std::fs::write(&text, vec![b'z'; 4096]).unwrap();
    let err = cache(tmp.path()).load_archive(&text).await.unwrap_err();
    assert!(matches!(err, ImageError::NotAnImage(_)), "{err}");
    let err = cache(tmp.path())
        .load_archive(&tmp.path().join("missing"))
        .await
        .unwrap_err();
    assert!(matches!(err, ImageError::NotAnImage(_)), "{err}");

    // A load cut short (a crash) leaves staging; the next open removes it.
    std::fs::create_dir_all(tmp.path().join("images/.tmp-cut/image/rootfs")).unwrap();
    let _ = cache(tmp.path());
    assert_cache_empty(tmp.path());
}

#[tokio::test]
async fn past_its_bound_the_cache_drops_the_least_recently_used_image_no_sandbox_runs_on() {
    use std::{collections::HashSet, time::Duration};
    let tmp = tempfile::tempdir().unwrap();
    let images = cache(tmp.path());
    let layout = |name: &str, content: &[u8]| {
        let dir = tmp.path().join(name);
        oci_layout(&dir, &[tar_of(&[E::File("data", content, 0o644)])]);
        dir
    };
    let (a_dir, b_dir) = (
        layout("a", &[b'a'; 64 << 10]),
        layout("b", &[b'b'; 64 << 10]),
    );
    let a = images.load_archive(&a_dir).await.unwrap();
    let b = images.load_archive(&b_dir).await.unwrap();
    let one = store::disk_usage(&a.rootfs);
    let none = HashSet::new();

    // Within the bound, or everything used within the grace period: nothing goes.
    assert!(images.evict(3 * one, &none, Duration::ZERO).is_empty());
    assert!(
        images
            .evict(one, &none, Duration::from_secs(600))
            .is_empty()
    );
    // Past it: the older of the two, unless a sandbox runs on it.
    let in_use_a = HashSet::from([a.digest.clone()]);
    assert_eq!(
        images.evict(one + one / 2, &in_use_a, Duration::ZERO),
        vec![b.digest.clone()]
    );
    assert!(!b.rootfs.exists() && a.rootfs.exists());
    // Loaded again, it is unpacked again (nothing remembered a removed image), and now
    // it is the more recent one.
    let b = images.load_archive(&b_dir).await.unwrap();
    assert!(b.rootfs.join("data").is_file());
    assert_eq!(
        images.evict(one + one / 2, &none, Duration::ZERO),
        vec![a.digest.clone()]
    );
    let left: Vec<_> = std::fs::read_dir(tmp.path().join("images"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        left,
        vec![b.digest.trim_start_matches("sha256:").to_owned()]
    );
}

#[tokio::test]
async fn a_docker_save_layer_that_links_to_a_host_file_is_read_inside_the_archive() {
    let tmp = tempfile::tempdir().unwrap();
    // A valid layer on the host, outside the archive: a link to it must not be read.
    let host_layer = tar_of(&[
        E::Dir("bin/"),
        E::File("bin/hello", b"from the host", 0o755),
    ]);
    let host_file = tmp.path().join("host-layer.tar");
    std::fs::write(&host_file, &host_layer).unwrap();
    let dir = tmp.path().join("saved");
    std::fs::create_dir_all(dir.join("l1")).unwrap();
    std::os::unix::fs::symlink(&host_file, dir.join("l1/layer.tar")).unwrap();
    let config = serde_json::json!({
        "rootfs": {"type": "layers", "diff_ids": [digest(&host_layer)]},
    })
    .to_string();
    let name = format!(
        "{}.json",
        digest(config.as_bytes()).trim_start_matches("sha256:")
    );
    std::fs::write(dir.join(&name), &config).unwrap();
    std::fs::write(
        dir.join("manifest.json"),
        serde_json::json!([{"Config": name, "Layers": ["l1/layer.tar"]}]).to_string(),
    )
    .unwrap();
    // As a directory, and as a tar that keeps the link a link.
    let archive = dir.with_extension("tar");
    let mut b = tar::Builder::new(std::fs::File::create(&archive).unwrap());
    b.follow_symlinks(false);
    b.append_dir_all(".", &dir).unwrap();
    b.finish().unwrap();
    for source in [dir.clone(), archive] {
        let err = cache(tmp.path()).load_archive(&source).await.unwrap_err();
        assert!(
            matches!(&err, ImageError::NotAnImage(m) if m.contains("l1/layer.tar")),
            "{}: {err}",
            source.display()
        );
        assert_cache_empty(tmp.path());
    }
}
