//! A tree removed whatever a sandbox left in it: directories without write or search
//! permission, and a directory swapped for a symlink mid-walk, whose target is never
//! changed.

use super::*;
use std::os::unix::fs::PermissionsExt;

#[test]
fn remove_all_handles_locked_directories() {
    let tmp = tempfile::tempdir().unwrap();
    let locked = tmp.path().join("a/b");
    std::fs::create_dir_all(&locked).unwrap();
    std::fs::write(locked.join("f"), "x").unwrap();
    std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o000)).unwrap();
    remove_all(&tmp.path().join("a")).unwrap();
    assert!(!tmp.path().join("a").exists());
    remove_all(&tmp.path().join("a")).unwrap();
}

/// The state a live sandbox process can make mid-walk: a directory the walk is about
/// to make writable swapped for a symlink to a directory it must never change.
#[test]
fn making_a_tree_writable_never_changes_what_a_swapped_in_symlink_names() {
    let tmp = tempfile::tempdir().unwrap();
    let outside = tmp.path().join("outside");
    std::fs::create_dir_all(outside.join("inner")).unwrap();
    std::fs::set_permissions(&outside, std::fs::Permissions::from_mode(0o555)).unwrap();
    let swapped = tmp.path().join("tree/a");
    std::fs::create_dir_all(tmp.path().join("tree")).unwrap();
    std::os::unix::fs::symlink(&outside, &swapped).unwrap();
    let locked = tmp.path().join("tree/b");
    std::fs::create_dir(&locked).unwrap();
    std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o000)).unwrap();

    make_writable(&swapped);
    make_writable(&tmp.path().join("tree"));

    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&outside), 0o555);
    assert_eq!(mode(&outside.join("inner")), 0o755);
    assert_eq!(mode(&locked), 0o700);
}
