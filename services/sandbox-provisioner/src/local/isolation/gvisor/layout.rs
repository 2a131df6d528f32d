//! A gVisor sandbox's files on the host, `<sandbox dir>/gvisor/`, made afresh each time
//! its container starts (nothing of an earlier runsc is reused) and removed with the
//! sandbox's directory: the bundle (`config.json`), the skeleton root of a sandbox on the
//! host's tools, the directory bound at `/run/forkyard`, and runsc's own state.
//!
//! Every mount point is made here, without following a symbolic link: runsc's file
//! server makes none in a read-only root, and an image's root is the image's to fill.

use super::bundle::Container;
use crate::local::{base::fs::remove_all, isolation::bubblewrap::bwrap};
use rustix::fs::{AtFlags, Mode, OFlags};
use std::{
    io,
    os::unix::fs::DirBuilderExt as _,
    path::{Component, Path, PathBuf},
};

/// The top-level directories of the skeleton root (its mount points and gVisor's).
const SKELETON_DIRS: &[&str] = &["usr", "etc", "proc", "dev", "tmp", "run", "workspace"];

#[derive(Debug, Clone)]
pub struct Layout {
    pub dir: PathBuf,
}

impl Layout {
    pub fn of_sandbox(sandbox_dir: &Path) -> Self {
        Self {
            dir: sandbox_dir.join("gvisor"),
        }
    }

    /// The bundle's directory, holding `config.json`.
    pub fn bundle(&self) -> PathBuf {
        self.dir.join("bundle")
    }

    /// The skeleton root of a sandbox on the host's tools.
    pub fn skeleton(&self) -> PathBuf {
        self.dir.join("root")
    }

    /// Bound at `super::bundle::RUN`: the mount points of the relays and tools.
    pub fn run(&self) -> PathBuf {
        self.dir.join("run")
    }

    /// runsc's `--root`: the container's state, the sandbox's uid's.
    pub fn state(&self) -> PathBuf {
        self.dir.join("state")
    }

    /// Remove what an earlier start left and make the directories: searchable by the
    /// sandbox's uid (`uid`, which runsc runs as), writable by it only for the state.
    pub fn reset(&self, uid: Option<u32>) -> io::Result<()> {
        remove_all(&self.dir)?;
        let mut b = std::fs::DirBuilder::new();
        // Its parent too for the probe's (a sandbox's directory is there already).
        b.recursive(true).mode(0o711).create(&self.dir)?;
        b.recursive(false);
        b.mode(0o755);
        for d in [self.bundle(), self.skeleton(), self.run()] {
            b.create(d)?;
        }
        b.mode(0o700).create(self.state())?;
        if let Some(uid) = uid {
            crate::local::isolation::uids::chown(&self.state(), uid)?;
        }
        Ok(())
    }

    /// The skeleton: the host's top-level links into /usr, and its mount points.
    pub fn make_skeleton(&self) -> io::Result<()> {
        let root = self.skeleton();
        for d in SKELETON_DIRS {
            std::fs::DirBuilder::new()
                .mode(0o755)
                .create(root.join(d))?;
        }
        for (path, link) in bwrap::host_root_links() {
            if let Some(target) = link {
                let rel = path.strip_prefix("/").unwrap_or(path);
                std::os::unix::fs::symlink(target, root.join(rel))?;
            }
        }
        Ok(())
    }

    /// Write `container`'s `config.json` and make its mount points.
    pub fn write(&self, container: &Container) -> io::Result<()> {
        for (base, rel, dir) in container.mount_points() {
            make_mount_point(&base, &rel, dir)?;
        }
        let config = serde_json::to_vec_pretty(&container.config()).map_err(io::Error::other)?;
        std::fs::write(self.bundle().join("config.json"), config)
    }
}

/// Make `rel` below `base` (a directory when `dir`, else an empty file) and the
/// directories above it, from the first that exists; none of them may be a symbolic
/// link (`base` is the provisioner's: a sandbox's directory, or an image's root). What
/// exists already as the right kind is kept (an image's own `/workspace`).
pub fn make_mount_point(base: &Path, rel: &Path, dir: bool) -> io::Result<()> {
    let mut at = rustix::fs::open(
        base,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let path = base.join(rel);
    let mut parts = Vec::new();
    for c in rel.components() {
        match c {
            Component::Normal(n) => parts.push(n.to_owned()),
            Component::CurDir => {}
            _ => {
                return Err(io::Error::other(format!(
                    "mount point {} leaves {}",
                    rel.display(),
                    base.display()
                )));
            }
        }
    }
    let Some((last, parents)) = parts.split_last() else {
        return Ok(());
    };
    for name in parents {
        at = match rustix::fs::mkdirat(&at, name.as_os_str(), Mode::from_raw_mode(0o755)) {
            Ok(()) | Err(rustix::io::Errno::EXIST) => open_dir(&at, name.as_os_str())?,
            Err(e) => return Err(e.into()),
        };
    }
    let made = if dir {
        rustix::fs::mkdirat(&at, last.as_os_str(), Mode::from_raw_mode(0o755))
    } else {
        let flags =
            OFlags::CREATE | OFlags::EXCL | OFlags::WRONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        rustix::fs::openat(&at, last.as_os_str(), flags, Mode::from_raw_mode(0o644)).map(drop)
    };
    match made {
        Err(rustix::io::Errno::EXIST) => {
            let st = rustix::fs::statat(&at, last.as_os_str(), AtFlags::SYMLINK_NOFOLLOW)?;
            let kind = rustix::fs::FileType::from_raw_mode(st.st_mode);
            let fits = if dir {
                kind == rustix::fs::FileType::Directory
            } else {
                kind != rustix::fs::FileType::Directory && kind != rustix::fs::FileType::Symlink
            };
            fits.then_some(()).ok_or_else(|| {
                io::Error::other(format!("{} is in the way of a mount point", path.display()))
            })
        }
        other => other.map_err(Into::into),
    }
}

/// `name` in `at`, a directory and not a symbolic link.
fn open_dir(at: &rustix::fd::OwnedFd, name: &std::ffi::OsStr) -> io::Result<rustix::fd::OwnedFd> {
    rustix::fs::openat(
        at,
        name,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| {
        io::Error::new(
            e.kind(),
            format!(
                "{}: {e} (a mount point's parent must be a directory)",
                name.to_string_lossy()
            ),
        )
    })
}
