//! The unpack thread's jail: defence in depth under [`crate::local::base::confined`]. An image is
//! unpacked on a thread of its own that has its own root directory (`unshare(CLONE_FS)`
//! then `chroot` into the directory it writes) and keeps only the capabilities that
//! writing an image's files needs (owners, modes, other uids' directories). It has no
//! `CAP_SYS_CHROOT` to climb back out, no mount of the host's under its root, and no
//! path leads anywhere else: a bug in the unpacker that followed a link or a `..`
//! would still land inside the image. The thread ends with the unpack, and with it
//! its root and capabilities (both per thread on Linux).
//!
//! A provisioner that is not root cannot `chroot`; it unpacks with its own uid's
//! powers, which over the host are none beyond its state directory (docs/security.md).

// `unshare` is unsafe in rustix because unsharing the descriptor table can strand
// descriptors other threads opened; only `CLONE_FS` (root, working directory, umask)
// is unshared here.
#![allow(unsafe_code)]

use rustix::thread::{CapabilitySet, CapabilitySets, UnshareFlags};
use std::path::{Path, PathBuf};

/// What an unpack keeps: setting owners, and writing and moding entries whatever
/// their owners and modes (an image's read-only directories).
const KEPT: CapabilitySet = CapabilitySet::CHOWN
    .union(CapabilitySet::DAC_OVERRIDE)
    .union(CapabilitySet::FOWNER);

/// Run `work` on a thread jailed in `root`; it gets the path under which `root` is seen
/// from inside (`/` when jailed).
pub fn run<R: Send>(root: &Path, work: impl FnOnce(&Path) -> R + Send) -> std::io::Result<R> {
    std::thread::scope(|s| {
        let thread = std::thread::Builder::new()
            .name("image-unpack".into())
            .spawn_scoped(s, move || -> std::io::Result<R> {
                let inside = enter(root)?;
                Ok(work(&inside))
            })?;
        thread
            .join()
            .map_err(|_| std::io::Error::other("the unpack thread panicked"))?
    })
}

/// Jail the calling thread in `root`; where `root` is seen from inside.
fn enter(root: &Path) -> std::io::Result<PathBuf> {
    // SAFETY: CLONE_FS only: this thread gets its own root, working directory and
    // umask; no descriptor, memory or signal state is unshared.
    unsafe { rustix::thread::unshare_unsafe(UnshareFlags::FS) }?;
    match rustix::process::chroot(root) {
        Ok(()) => {}
        // Not root: no jail, and no power over the host's files to jail either.
        Err(rustix::io::Errno::PERM) if !rustix::process::geteuid().is_root() => {
            return Ok(root.to_path_buf());
        }
        Err(e) => return Err(e.into()),
    }
    rustix::process::chdir("/")?;
    let had = rustix::thread::capabilities(None)?;
    rustix::thread::set_capabilities(
        None,
        CapabilitySets {
            effective: had.permitted & KEPT,
            permitted: had.permitted & KEPT,
            inheritable: CapabilitySet::empty(),
        },
    )?;
    Ok(PathBuf::from("/"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_jailed_thread_sees_only_its_root_and_cannot_climb_out() {
        let tmp = tempfile::tempdir().unwrap();
        let canary = tmp.path().join("canary");
        std::fs::create_dir(&canary).unwrap();
        std::fs::write(canary.join("keep"), "host file").unwrap();
        let jail = tmp.path().join("jail");
        std::fs::create_dir(&jail).unwrap();
        std::os::unix::fs::symlink(&canary, jail.join("out")).unwrap();
        let root = rustix::process::geteuid().is_root();

        let canary_inside = canary.clone();
        let (inside, by_path, through_link, escape, caps) = run(&jail, move |inside| {
            // A buggy unpacker removing by host path, or through a link.
            let by_path = std::fs::remove_file(canary_inside.join("keep")).is_err();
            let through_link = std::fs::remove_file("/out/keep").is_err();
            let escape = rustix::process::chroot("/..").is_err();
            let caps = rustix::thread::capabilities(None).unwrap().effective;
            (inside.to_path_buf(), by_path, through_link, escape, caps)
        })
        .unwrap();
        if root {
            assert_eq!(inside, Path::new("/"));
            assert!(
                by_path && through_link && escape,
                "the jail let the unpacker out"
            );
            assert!(KEPT.contains(caps), "kept {caps:?}");
            assert_eq!(
                std::fs::read_to_string(canary.join("keep")).unwrap(),
                "host file"
            );
            // The calling thread kept its own root and capabilities.
            let mine = rustix::thread::capabilities(None).unwrap().effective;
            assert!(mine.contains(CapabilitySet::SYS_CHROOT));
        } else {
            // Not root: no jail, and the thread's powers are the provisioner's uid's.
            assert_eq!(inside, jail);
            forkyard_common::testing::requires(
                forkyard_common::testing::Need::Root,
                false,
                "the unpack jail (chroot, capabilities dropped)",
            );
        }
    }
}
