//! What a sandbox's workspace counts against its disk limit, and the sandboxes
//! directory spread over the filesystem.

use super::*;
use crate::local::{base::fd_walk, isolation::uids};

/// A sandbox cannot hide bytes from its limit below a chain of directories deeper
/// than the count walks: too deep to count is over.
#[test]
fn a_tree_too_deep_to_count_is_over_its_limit() {
    use rustix::fs::{Mode, OFlags, mkdirat, openat};
    use std::io::Write as _;
    let tmp = tempfile::tempdir().unwrap();
    let ws = tmp.path().join("ws");
    std::fs::create_dir(&ws).unwrap();
    let mut fd = rustix::fs::open(&ws, OFlags::DIRECTORY, Mode::empty()).unwrap();
    for _ in 0..fd_walk::MAX_DEPTH + 2 {
        mkdirat(&fd, "d", Mode::from_raw_mode(0o755)).unwrap();
        fd = openat(&fd, "d", OFlags::DIRECTORY, Mode::empty()).unwrap();
    }
    let big = openat(
        &fd,
        "big",
        OFlags::WRONLY | OFlags::CREATE,
        Mode::from_raw_mode(0o644),
    )
    .unwrap();
    std::fs::File::from(big)
        .write_all(&vec![7u8; 4 << 20])
        .unwrap();
    assert!(disk_usage_over(&ws, 1 << 30).is_some());
}

/// What a sandbox's disk limit counts: not the git objects it shares with other
/// copies (root's, linked), and a file it linked twice once. Where the workspace is
/// the provisioner's own (no sandbox uids), linked files of the provisioner count.
#[test]
fn a_workspace_counts_its_own_bytes_not_the_objects_it_shares() {
    use std::os::unix::fs::MetadataExt;
    if !forkyard_common::testing::requires(
        forkyard_common::testing::Need::Root,
        rustix::process::geteuid().is_root(),
        "a workspace given to a sandbox uid",
    ) {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let template_pack = tmp.path().join("pack");
    std::fs::write(&template_pack, vec![7u8; 4 << 20]).unwrap();
    let ws = tmp.path().join("ws");
    std::fs::create_dir(&ws).unwrap();
    std::fs::hard_link(&template_pack, ws.join("shared.pack")).unwrap();
    std::fs::write(ws.join("own"), vec![1u8; 256 << 10]).unwrap();
    std::fs::hard_link(ws.join("own"), ws.join("own-again")).unwrap();
    uids::chown(&ws, 2_000_123).unwrap();
    uids::chown(&ws.join("own"), 2_000_123).unwrap();

    let usage = workspace_usage(&ws);
    assert!(
        (256 << 10..1 << 20).contains(&usage),
        "{usage} bytes: the linked file once, the shared pack not at all"
    );
    assert_eq!(disk_usage_over(&ws, 1 << 20), None);
    assert!(disk_usage_over(&ws, 128 << 10).is_some());

    uids::chown(&ws, 0).unwrap();
    assert_eq!(std::fs::metadata(&ws).unwrap().uid(), 0);
    assert!(
        workspace_usage(&ws) > 4 << 20,
        "without uids nothing is shared"
    );
}

/// Where the filesystem keeps inode flags (ext2/3/4, this machine's disk), the
/// sandboxes directory is a top directory; elsewhere opening the store still works.
#[test]
fn sandboxes_spread_over_the_filesystem_where_it_can() {
    let tmp = tempfile::tempdir().unwrap();
    let probe = tmp.path().join("probe");
    std::fs::create_dir(&probe).unwrap();
    let supported = rustix::fs::ioctl_getflags(std::fs::File::open(&probe).unwrap()).is_ok();
    let store = Store::open(tmp.path()).unwrap();
    let flags = rustix::fs::ioctl_getflags(std::fs::File::open(store.root()).unwrap());
    if supported {
        assert!(flags.unwrap().contains(rustix::fs::IFlags::TOPDIR));
        // Opening again (a restart) keeps it and changes nothing else.
        let again = Store::open(tmp.path()).unwrap();
        let after = rustix::fs::ioctl_getflags(std::fs::File::open(again.root()).unwrap());
        assert!(after.unwrap().contains(rustix::fs::IFlags::TOPDIR));
    }
}
