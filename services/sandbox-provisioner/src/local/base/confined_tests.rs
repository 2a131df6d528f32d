//! A tree changed beneath its root by descriptor, with links a lower layer made
//! pointing at a host directory that must come through every operation unchanged.

use super::*;
use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _, symlink};

const META: Meta = Meta {
    mode: 0o644,
    uid: 0,
    gid: 0,
    mtime: 1_700_000_000,
};

/// A root with `evil -> <host>` and `dir/` inside, and a host directory holding `keep`.
fn setup() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let host = tmp.path().join("host");
    std::fs::create_dir_all(host.join("sub")).unwrap();
    std::fs::write(host.join("keep"), "host").unwrap();
    std::fs::write(host.join("sub/deep"), "host").unwrap();
    let root = tmp.path().join("root");
    std::fs::create_dir_all(root.join("dir")).unwrap();
    symlink(&host, root.join("evil")).unwrap();
    (tmp, root, host)
}

fn host_intact(host: &Path) {
    assert_eq!(std::fs::read_to_string(host.join("keep")).unwrap(), "host");
    assert_eq!(
        std::fs::read_to_string(host.join("sub/deep")).unwrap(),
        "host"
    );
    let names: Vec<_> = std::fs::read_dir(host)
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(names.len(), 2, "{names:?}");
}

fn through_link(r: Result<impl std::fmt::Debug, ConfineError>) {
    assert!(
        matches!(r, Err(ConfineError::ThroughLink(ref p)) if p == Path::new("evil")),
        "{r:?}"
    );
}

#[test]
fn nothing_is_changed_through_a_link_whatever_the_operation() {
    let (_tmp, root, host) = setup();
    let mut t = Tree::open(&root, false).unwrap();
    through_link(t.remove(Path::new("evil/keep")));
    through_link(t.clear(Path::new("evil")));
    through_link(t.clear(Path::new("evil/sub")));
    through_link(t.file(Path::new("evil/keep"), &mut &b"x"[..], META));
    through_link(t.file(Path::new("evil/new"), &mut &b"x"[..], META));
    through_link(t.mkdir(Path::new("evil/d"), META));
    through_link(t.symlink(Path::new("evil/l"), Path::new("/"), META));
    through_link(t.hardlink(Path::new("dir/h"), Path::new("evil/keep")));
    through_link(t.hardlink(Path::new("evil/h"), Path::new("dir")));
    host_intact(&host);
}

#[test]
fn a_link_as_the_last_component_is_changed_itself() {
    let (_tmp, root, host) = setup();
    let mut t = Tree::open(&root, false).unwrap();
    // Replaced by a file: the link goes, the host directory stays.
    t.file(Path::new("evil"), &mut &b"now a file"[..], META)
        .unwrap();
    assert_eq!(std::fs::read(root.join("evil")).unwrap(), b"now a file");
    host_intact(&host);
    symlink(&host, root.join("evil2")).unwrap();
    t.remove(Path::new("evil2")).unwrap();
    assert!(std::fs::symlink_metadata(root.join("evil2")).is_err());
    symlink(&host, root.join("evil3")).unwrap();
    t.mkdir(Path::new("evil3"), META).unwrap();
    assert!(
        std::fs::symlink_metadata(root.join("evil3"))
            .unwrap()
            .is_dir()
    );
    host_intact(&host);
}

#[test]
fn a_directory_is_removed_and_cleared_without_following_links_inside_it() {
    let (_tmp, root, host) = setup();
    std::fs::create_dir_all(root.join("dir/a/b")).unwrap();
    symlink(&host, root.join("dir/a/b/out")).unwrap();
    std::fs::write(root.join("dir/a/f"), "f").unwrap();
    // A directory its owner closed.
    std::fs::set_permissions(root.join("dir/a/b"), std::fs::Permissions::from_mode(0o000)).unwrap();
    let mut t = Tree::open(&root, false).unwrap();
    t.clear(Path::new("dir")).unwrap();
    assert_eq!(std::fs::read_dir(root.join("dir")).unwrap().count(), 0);
    t.remove(Path::new("dir")).unwrap();
    assert!(!root.join("dir").exists());
    // Missing entries and missing parents are no error, and nothing is made.
    t.remove(Path::new("nothing/here")).unwrap();
    t.clear(Path::new("nothing")).unwrap();
    assert!(!root.join("nothing").exists());
    host_intact(&host);
}

#[test]
fn paths_that_are_not_plain_are_refused() {
    let (_tmp, root, host) = setup();
    let mut t = Tree::open(&root, false).unwrap();
    for p in ["../host/keep", "/abs", "dir/../../host/keep", ""] {
        let r = t.file(Path::new(p), &mut &b"x"[..], META);
        assert!(matches!(r, Err(ConfineError::BadPath(..))), "{p}: {r:?}");
    }
    let deep = "d/".repeat(MAX_DEPTH + 1) + "f";
    assert!(matches!(
        t.file(Path::new(&deep), &mut &b"x"[..], META),
        Err(ConfineError::BadPath(..))
    ));
    host_intact(&host);
}

#[test]
fn files_links_and_directories_are_written_with_their_modes_and_no_setuid() {
    let (_tmp, root, _host) = setup();
    let mut t = Tree::open(&root, false).unwrap();
    let suid = Meta {
        mode: 0o4755,
        ..META
    };
    assert_eq!(
        t.file(Path::new("usr/bin/su"), &mut &b"root"[..], suid)
            .unwrap(),
        4
    );
    t.mkdir(
        Path::new("ro"),
        Meta {
            mode: 0o555,
            ..META
        },
    )
    .unwrap();
    t.file(Path::new("ro/inside"), &mut &b"x"[..], META)
        .unwrap();
    t.symlink(Path::new("usr/bin/sh"), Path::new("/host/anything"), META)
        .unwrap();
    t.hardlink(Path::new("usr/bin/su2"), Path::new("usr/bin/su"))
        .unwrap();
    // Duplicate entries: the last one wins.
    t.file(Path::new("ro/inside"), &mut &b"again"[..], META)
        .unwrap();
    t.finish().unwrap();

    let m = |p: &str| std::fs::symlink_metadata(root.join(p)).unwrap();
    assert_eq!(m("usr/bin/su").mode() & 0o7777, 0o755);
    assert_eq!(m("usr/bin/su").mtime(), 1_700_000_000);
    assert_eq!(m("usr/bin/su").ino(), m("usr/bin/su2").ino());
    assert_eq!(m("ro").mode() & 0o7777, 0o555);
    assert_eq!(std::fs::read(root.join("ro/inside")).unwrap(), b"again");
    assert_eq!(
        std::fs::read_link(root.join("usr/bin/sh")).unwrap(),
        Path::new("/host/anything")
    );
    // Made parents.
    assert!(m("usr").is_dir() && m("usr/bin").is_dir());
}

#[test]
fn a_hard_link_names_an_entry_beneath_the_root_or_nothing() {
    let (_tmp, root, host) = setup();
    let mut t = Tree::open(&root, false).unwrap();
    // `host/keep` beneath the root does not exist: refused, not linked to the host's.
    let r = t.hardlink(Path::new("h"), Path::new("host/keep"));
    assert!(
        matches!(r, Err(ConfineError::BadPath(..) | ConfineError::Io(..))),
        "{r:?}"
    );
    // A link to a link is to the link itself.
    t.hardlink(Path::new("h2"), Path::new("evil")).unwrap();
    assert!(
        std::fs::symlink_metadata(root.join("h2"))
            .unwrap()
            .is_symlink()
    );
    host_intact(&host);
}

#[test]
fn an_archive_file_is_read_with_its_links_resolved_inside_it() {
    let (tmp, root, _host) = setup();
    std::fs::write(root.join("dir/layer.tar"), "layer").unwrap();
    symlink("../dir/layer.tar", root.join("relative")).unwrap();
    symlink("/dir/layer.tar", root.join("absolute")).unwrap();
    std::fs::write(tmp.path().join("secret"), "host secret").unwrap();
    symlink(tmp.path().join("secret"), root.join("out")).unwrap();
    symlink("../../../../secret", root.join("up")).unwrap();
    let read = |p: &str| std::io::read_to_string(open_in_root(&root, p)?);
    assert_eq!(read("relative").unwrap(), "layer");
    assert_eq!(read("absolute").unwrap(), "layer");
    assert!(read("out").is_err(), "followed a link out of the archive");
    assert!(read("up").is_err(), "climbed out of the archive");
    assert!(
        read("evil/keep").is_err(),
        "followed a link out of the archive"
    );
    assert!(read("dir").is_err(), "a directory is not a file");
}

#[test]
fn zeros_are_written_as_holes() {
    use std::io::Read as _;
    let (_tmp, root, _host) = setup();
    let mut t = Tree::open(&root, false).unwrap();
    let gib = 1u64 << 30;
    let mut zeros = std::io::repeat(0).take(gib);
    assert_eq!(t.file(Path::new("sparse"), &mut zeros, META).unwrap(), gib);
    let mut data = b"head".to_vec();
    data.resize(1 << 20, 0);
    data.extend_from_slice(b"tail");
    t.file(Path::new("mixed"), &mut data.as_slice(), META)
        .unwrap();
    let m = std::fs::metadata(root.join("sparse")).unwrap();
    assert_eq!(m.len(), gib);
    assert!(
        m.blocks() * 512 < 1 << 20,
        "allocated {} bytes",
        m.blocks() * 512
    );
    assert_eq!(std::fs::read(root.join("mixed")).unwrap(), data);
}
