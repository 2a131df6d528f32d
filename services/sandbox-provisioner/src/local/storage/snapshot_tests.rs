//! Snapshots saved and restored against real trees: links kept as links, the disk limit
//! held both ways, and nothing written or archived through a link.

use super::*;
use std::{
    io::Read,
    os::unix::fs::symlink,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
};

/// Every regular file's contents in an archive of `ws`, and its symlinks' targets.
fn archived(ws: &Path) -> Listing {
    try_archived(ws).unwrap()
}

type Listing = (Vec<(PathBuf, String)>, Vec<(PathBuf, PathBuf)>);

fn try_archived(ws: &Path) -> std::io::Result<Listing> {
    let mut tar = tar::Builder::new(Vec::new());
    archive(&mut tar, ws, Bound::FreeSpace(u64::MAX))?;
    let bytes = tar.into_inner().unwrap();
    let mut files = Vec::new();
    let mut links = Vec::new();
    let mut reader = tar::Archive::new(bytes.as_slice());
    for entry in reader.entries().unwrap() {
        let mut entry = entry.unwrap();
        let path = entry.path().unwrap().into_owned();
        match entry.header().entry_type() {
            tar::EntryType::Regular => {
                let mut s = String::new();
                entry.read_to_string(&mut s).unwrap();
                files.push((path, s));
            }
            tar::EntryType::Symlink => {
                links.push((path, entry.link_name().unwrap().unwrap().into_owned()));
            }
            _ => {}
        }
    }
    Ok((files, links))
}

#[test]
fn a_workspace_is_archived_with_its_links_as_links() {
    let tmp = tempfile::tempdir().unwrap();
    let outside = tmp.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    std::fs::write(outside.join("secret"), "host").unwrap();
    let ws = tmp.path().join("ws");
    std::fs::create_dir_all(ws.join("src")).unwrap();
    std::fs::write(ws.join("src/main.rs"), "fn main() {}").unwrap();
    symlink(&outside, ws.join("escape")).unwrap();
    let (files, links) = archived(&ws);
    assert_eq!(
        files,
        vec![(PathBuf::from("src/main.rs"), "fn main() {}".to_owned())]
    );
    assert_eq!(links, vec![(PathBuf::from("escape"), outside)]);
}

/// A sparse file's holes would be saved, and restored, as zeros: file data over the
/// sandbox's disk limit is refused, whatever blocks it takes.
#[test]
fn a_save_refuses_more_file_data_than_the_disk_limit() {
    let tmp = tempfile::tempdir().unwrap();
    let ws = tmp.path().join("ws");
    std::fs::create_dir(&ws).unwrap();
    std::fs::File::create(ws.join("sparse"))
        .unwrap()
        .set_len(1 << 40)
        .unwrap();
    let mut tar = tar::Builder::new(std::io::sink());
    let err = archive(&mut tar, &ws, Bound::DiskLimit(64 << 20)).unwrap_err();
    assert!(err.get_ref().is_some_and(|e| e.is::<TooBig>()), "{err}");
    std::fs::File::create(ws.join("sparse"))
        .unwrap()
        .set_len(1 << 20)
        .unwrap();
    let mut tar = tar::Builder::new(std::io::sink());
    archive(&mut tar, &ws, Bound::DiskLimit(64 << 20)).unwrap();
}

/// Without a disk limit a save is still bounded: no sandbox holds more file data
/// than its filesystem, and a sparse file larger than that would be read for hours
/// and restored as zeros until the disk is full.
#[test]
fn a_save_without_a_disk_limit_refuses_a_file_larger_than_its_filesystem() {
    let tmp = tempfile::tempdir().unwrap();
    let ws = tmp.path().join("ws");
    std::fs::create_dir(&ws).unwrap();
    let bound = save_bound(&ws, 0).unwrap();
    assert!(matches!(bound, Bound::Filesystem(_)), "{bound:?}");
    std::fs::File::create(ws.join("sparse"))
        .unwrap()
        .set_len(bound.bytes() + (1 << 20))
        .unwrap();
    let mut tar = tar::Builder::new(std::io::sink());
    let err = archive(&mut tar, &ws, bound).unwrap_err();
    let too_big = err.get_ref().and_then(|e| e.downcast_ref::<TooBig>());
    assert!(
        too_big.is_some_and(|t| t.to_string().contains("its filesystem holds")),
        "{err}"
    );
}

/// Snapshot `id` of `ws` in `snaps`, saved without any bound (as one saved before
/// saves had one).
fn store_unbounded(snaps: &Snapshots, id: &str, ws: &Path) {
    let file = std::fs::File::create(snaps.tarball(id)).unwrap();
    let mut tar = tar::Builder::new(flate2::write::GzEncoder::new(
        file,
        flate2::Compression::fast(),
    ));
    archive(&mut tar, ws, Bound::FreeSpace(u64::MAX)).unwrap();
    tar.into_inner().unwrap().finish().unwrap();
    let meta = Meta {
        id: id.into(),
        source_sandbox: "sbx-test".into(),
        repo: String::new(),
        branch: String::new(),
        base_commit: String::new(),
        created_unix_ms: 0,
        bytes: 0,
        labels: Default::default(),
    };
    std::fs::write(
        snaps.dir.join(format!("{id}.json")),
        serde_json::to_vec(&meta).unwrap(),
    )
    .unwrap();
}

/// A snapshot holding more file data than the sandbox it is restored into may hold is
/// refused, naming the limit, and leaves no half-restored workspace; within the
/// limit it restores as saved.
#[test]
fn a_restore_refuses_more_file_data_than_the_disk_limit_and_leaves_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let snaps = Snapshots::open(&tmp.path().join("snaps")).unwrap();
    let ws = tmp.path().join("ws");
    std::fs::create_dir_all(ws.join("src")).unwrap();
    std::fs::write(ws.join("src/a.txt"), "kept\n").unwrap();
    std::fs::File::create(ws.join("sparse"))
        .unwrap()
        .set_len(8 << 20)
        .unwrap();
    store_unbounded(&snaps, "snap-big", &ws);

    let dest = tmp.path().join("restored");
    let err = snaps.unpack("snap-big", &dest, 4 << 20).unwrap_err();
    assert!(
        matches!(&err, ProvisionerError::FailedPrecondition(m)
            if m.contains("snap-big") && m.contains("disk limit of 4194304 bytes")),
        "{err:?}"
    );
    assert!(!dest.exists(), "a half-restored workspace was left");

    snaps.unpack("snap-big", &dest, 16 << 20).unwrap();
    assert_eq!(
        std::fs::read_to_string(dest.join("src/a.txt")).unwrap(),
        "kept\n"
    );
    let sparse = std::fs::metadata(dest.join("sparse")).unwrap();
    assert_eq!(sparse.len(), 8 << 20);
    // Restored as a hole, as it was saved from one: no block of zeros written.
    assert!(
        std::os::unix::fs::MetadataExt::blocks(&sparse) * 512 < 1 << 20,
        "{} bytes allocated",
        std::os::unix::fs::MetadataExt::blocks(&sparse) * 512
    );
}

/// A snapshot is a sandbox's work: one whose tar holds a link and then writes
/// through it (as a hostile sandbox could craft in its own snapshot store) is
/// refused, and the link's target is untouched.
#[test]
fn a_restore_never_writes_through_a_link_the_snapshot_holds() {
    let tmp = tempfile::tempdir().unwrap();
    let snaps = Snapshots::open(&tmp.path().join("snaps")).unwrap();
    let outside = tmp.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    std::fs::write(outside.join("f"), "host file").unwrap();
    let file = std::fs::File::create(snaps.tarball("snap-evil")).unwrap();
    let mut tar = tar::Builder::new(flate2::write::GzEncoder::new(
        file,
        flate2::Compression::fast(),
    ));
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Symlink);
    h.set_size(0);
    tar.append_link(&mut h, "x", &outside).unwrap();
    let mut h = tar::Header::new_gnu();
    h.set_size(5);
    h.set_mode(0o644);
    tar.append_data(&mut h, "x/f", &b"pwned"[..]).unwrap();
    tar.into_inner().unwrap().finish().unwrap();
    let meta = serde_json::json!({"id": "snap-evil", "source_sandbox": "s", "repo": "", "branch": "",
        "base_commit": "", "created_unix_ms": 0, "bytes": 0});
    std::fs::write(snaps.dir.join("snap-evil.json"), meta.to_string()).unwrap();
    let dest = tmp.path().join("restored");
    assert!(snaps.unpack("snap-evil", &dest, 0).is_err());
    assert_eq!(
        std::fs::read_to_string(outside.join("f")).unwrap(),
        "host file"
    );
    assert!(!dest.exists());
}

/// A sandbox still running while it is saved swaps a directory it owns for a symlink
/// to the host, over and over: no archive may ever hold the host file's bytes.
#[test]
fn a_directory_swapped_for_a_symlink_mid_save_never_archives_what_it_names() {
    let tmp = tempfile::tempdir().unwrap();
    let outside = tmp.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    std::fs::write(outside.join("f"), "host secret").unwrap();
    let ws = tmp.path().join("ws");
    std::fs::create_dir_all(ws.join("d")).unwrap();
    std::fs::write(ws.join("d/f"), "sandbox's own").unwrap();
    symlink(&outside, ws.join("x")).unwrap();

    let stop = Arc::new(AtomicBool::new(false));
    let swapper = {
        let (stop, ws) = (stop.clone(), ws.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                rustix::fs::renameat_with(
                    rustix::fs::CWD,
                    ws.join("d"),
                    rustix::fs::CWD,
                    ws.join("x"),
                    rustix::fs::RenameFlags::EXCHANGE,
                )
                .unwrap();
            }
        })
    };
    let (mut leaked, mut failed) = (0, 0);
    for _ in 0..2_000 {
        match try_archived(&ws) {
            Ok((files, _)) => {
                leaked += files.iter().filter(|(_, s)| s.contains("host")).count();
            }
            Err(_) => failed += 1,
        }
    }
    stop.store(true, Ordering::Relaxed);
    swapper.join().unwrap();
    assert_eq!(leaked, 0, "host bytes archived {leaked} times");
    // Nothing it pinned can change under it: a save never fails for the race either.
    assert_eq!(failed, 0, "{failed} saves failed");
}
