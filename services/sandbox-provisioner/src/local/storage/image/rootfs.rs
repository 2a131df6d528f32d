//! What an unpacked root filesystem needs before a sandbox can run on it.

use crate::local::base::fs::remove_all;
use std::{
    os::unix::fs::PermissionsExt as _,
    path::{Component, Path, PathBuf},
};

/// Directories bubblewrap mounts on: the root is bound read-only, so they must exist
/// in the image itself (as directories: whatever else an image put there is replaced).
/// `/run` gets a tmpfs, for the sandbox's relay sockets.
const MOUNT_POINTS: &[&str] = &["workspace", "proc", "dev", "tmp", "run"];

pub fn make_mount_points(rootfs: &Path) -> std::io::Result<()> {
    for name in MOUNT_POINTS {
        let p = rootfs.join(name);
        match std::fs::symlink_metadata(&p) {
            Ok(m) if m.is_dir() => continue,
            Ok(m) if m.is_symlink() || m.is_file() => std::fs::remove_file(&p)?,
            Ok(_) => remove_all(&p)?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        std::fs::create_dir(&p)?;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755))?;
    }
    Ok(())
}

/// Whether `/bin/sh` of the image is an executable file (every command of an agent, a
/// verify command and the patch steps go through a shell).
pub fn has_shell(rootfs: &Path) -> bool {
    resolve_within(rootfs, Path::new("bin/sh")).is_some_and(|p| {
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    })
}

/// `rel` inside `root`, its symbolic links followed as the sandbox would see them
/// (absolute targets from the image's root, `..` never above it).
fn resolve_within(root: &Path, rel: &Path) -> Option<PathBuf> {
    let mut todo: Vec<PathBuf> = rel
        .components()
        .rev()
        .map(|c| c.as_os_str().into())
        .collect();
    let mut at = PathBuf::new();
    let mut links = 0;
    while let Some(part) = todo.pop() {
        match Path::new(&part).components().next()? {
            Component::RootDir => at.clear(),
            Component::ParentDir => {
                at.pop();
            }
            Component::CurDir => {}
            Component::Normal(name) => {
                let next = at.join(name);
                let full = root.join(&next);
                let meta = std::fs::symlink_metadata(&full).ok()?;
                if meta.is_symlink() {
                    links += 1;
                    if links > 40 {
                        return None;
                    }
                    let target = std::fs::read_link(&full).ok()?;
                    if target.is_absolute() {
                        at.clear();
                    }
                    todo.extend(target.components().rev().map(|c| c.as_os_str().into()));
                } else {
                    at = next;
                }
            }
            Component::Prefix(_) => return None,
        }
    }
    Some(root.join(at))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn a_shell_is_found_through_links_that_stay_inside_the_image() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        std::fs::create_dir_all(r.join("usr/bin")).unwrap();
        symlink("usr/bin", r.join("bin")).unwrap();
        std::fs::write(r.join("usr/bin/dash"), "#!").unwrap();
        std::fs::set_permissions(
            r.join("usr/bin/dash"),
            std::fs::Permissions::from_mode(0o755),
        )
        .unwrap();
        symlink("/usr/bin/../bin/dash", r.join("usr/bin/sh")).unwrap();
        assert!(has_shell(r));
        // A link that climbs out lands on the image's own root, not the host's.
        std::fs::remove_file(r.join("usr/bin/sh")).unwrap();
        symlink("../../../../../../bin/sh", r.join("usr/bin/sh")).unwrap();
        assert!(!has_shell(r), "followed a link out of the image");
        std::fs::remove_file(r.join("usr/bin/sh")).unwrap();
        assert!(!has_shell(r));
    }

    #[test]
    fn mount_points_replace_what_an_image_put_there() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        std::fs::write(r.join("workspace"), "a file").unwrap();
        symlink("/etc", r.join("run")).unwrap();
        std::fs::create_dir(r.join("tmp")).unwrap();
        std::fs::write(r.join("tmp/kept"), "").unwrap();
        make_mount_points(r).unwrap();
        for name in MOUNT_POINTS {
            let m = std::fs::symlink_metadata(r.join(name)).unwrap();
            assert!(m.is_dir(), "{name}");
        }
        assert!(r.join("tmp/kept").exists());
        assert!(std::fs::read_dir(r.join("run")).unwrap().next().is_none());
    }
}
