//! A hard disk limit per sandbox where the filesystem offers one. On btrfs with quotas
//! enabled (`btrfs quota enable <mount>`), each sandbox's directory is a subvolume of
//! its own with a qgroup limit, so a write past the limit fails with `EDQUOT` and the
//! host's disk is never fuller than the limit allows, however fast the agent writes.
//!
//! The limit set is the sandbox's `disk_bytes` plus a margin ([`hard_limit`]): the
//! workspace watch (`crate::local::storage::disk_watch`) still sees the crossing, ends the command and
//! names the reason; the quota is the wall behind it. `fallocate` of more than the
//! quota leaves fails whole, so nothing is written and nothing is crossed.
//!
//! ext4 and XFS project quotas are not used: this project's hosts run kernels without
//! them (`CONFIG_QFMT_V2` and `CONFIG_XFS_QUOTA` unset), so that path could not be
//! tested here. Elsewhere the watch alone bounds a sandbox (the README says which).

use crate::local::base::fs::remove_all;
use std::{
    ffi::OsStr,
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    process::Command,
};

/// `statfs` type of btrfs.
const BTRFS_MAGIC: u64 = 0x9123_683e;

/// Whether a hard quota is used (`FORKYARD_SANDBOX_DISK_QUOTA`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum QuotaMode {
    /// Where the state directory's filesystem offers one (btrfs with quotas enabled,
    /// provisioner run as root); the watch alone otherwise.
    #[default]
    Auto,
    /// Refuse to start without one.
    Required,
    /// Never; the watch alone.
    Off,
}

/// Subvolume-per-sandbox quotas on the btrfs that holds `sandboxes/`.
#[derive(Debug, Clone)]
pub struct DiskQuota {
    btrfs: PathBuf,
}

/// The qgroup limit for a sandbox bound to `disk_bytes`: 1/32 more, at least 32 MiB
/// more, so an agent that writes until refused is over its bound and the watch says so.
pub fn hard_limit(disk_bytes: u64) -> u64 {
    disk_bytes.saturating_add((disk_bytes / 32).max(32 << 20))
}

/// The largest file a sandbox bound to `disk_bytes` may write (`RLIMIT_FSIZE` on each
/// of its processes): the quota's wall ([`hard_limit`]), so a single write or
/// `fallocate` past the bound fails inside the sandbox on every filesystem, where only
/// btrfs has a quota on the total (`fallocate -l 3G` in a sandbox bound to 100 MiB used
/// to succeed and hold the disk until the watch killed the command). `None` unbounded.
pub fn file_size_limit(disk_bytes: u64) -> Option<u64> {
    (disk_bytes > 0).then(|| hard_limit(disk_bytes))
}

impl DiskQuota {
    /// The quota to use for sandboxes under `sandboxes`, or why there is none. `Ok(None)`
    /// in mode `Auto` when the filesystem offers none (logged by the caller with the
    /// reason); `Err` (a configuration error) in mode `Required`.
    pub fn detect(mode: QuotaMode, sandboxes: &Path, btrfs: &Path) -> Result<Option<Self>, String> {
        if mode == QuotaMode::Off {
            return Ok(None);
        }
        match Self::usable(sandboxes, btrfs) {
            Ok(q) => Ok(Some(q)),
            Err(why) if mode == QuotaMode::Required => Err(format!(
                "--sandbox-disk-quota (FORKYARD_SANDBOX_DISK_QUOTA) is required: {why}"
            )),
            Err(why) => {
                tracing::info!(reason = %why, "no hard disk quota: a sandbox's disk limit is enforced by watching its workspace");
                Ok(None)
            }
        }
    }

    fn usable(sandboxes: &Path, btrfs: &Path) -> Result<Self, String> {
        let fs = rustix::fs::statfs(sandboxes)
            .map_err(|e| format!("cannot statfs {}: {e}", sandboxes.display()))?;
        // The field's integer type differs between libcs; the value is a magic number.
        #[allow(clippy::unnecessary_cast, clippy::cast_sign_loss)]
        let kind = fs.f_type as u64;
        if kind != BTRFS_MAGIC {
            return Err(format!(
                "{} is not on btrfs (the only filesystem whose quotas are used)",
                sandboxes.display()
            ));
        }
        if !rustix::process::geteuid().is_root() {
            return Err("quota limits need the provisioner to run as root".into());
        }
        let q = Self {
            btrfs: btrfs.to_path_buf(),
        };
        q.run(["qgroup", "show"], sandboxes).map_err(|e| {
            format!(
                "quotas are not enabled on the btrfs holding {} (btrfs quota enable <mount point>): {e}",
                sandboxes.display()
            )
        })?;
        // A whole subvolume with a limit, made and removed: permissions, tools, kernel.
        let probe = sandboxes.join(".quota-probe");
        let _ = remove_all(&probe);
        let made = q.make_dir(&probe, 1 << 20, 0o700);
        let _ = remove_all(&probe);
        made.map_err(|e| format!("cannot make a subvolume with a limit: {e}"))?;
        Ok(q)
    }

    /// Make `dir` (which must not exist) a subvolume of mode `mode`, limited to
    /// [`hard_limit`] of `disk_bytes` (no limit when 0). Blocking.
    pub fn make_dir(&self, dir: &Path, disk_bytes: u64, mode: u32) -> std::io::Result<()> {
        self.run(["subvolume", "create"], dir)?;
        let limited = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode))
            .and_then(|()| match disk_bytes {
                0 => Ok(()),
                n => self.run(["qgroup", "limit", &hard_limit(n).to_string()], dir),
            });
        if limited.is_err() {
            // An empty subvolume goes with rmdir (root, Linux 4.18 and later).
            let _ = remove_all(dir);
        }
        limited
    }

    fn run<const N: usize>(&self, args: [&str; N], path: &Path) -> std::io::Result<()> {
        let out = Command::new(&self.btrfs)
            .args(args)
            .arg(OsStr::new(path))
            .output()?;
        if out.status.success() {
            return Ok(());
        }
        let err = String::from_utf8_lossy(&out.stderr);
        Err(std::io::Error::other(format!(
            "{} {}: {}",
            self.btrfs.display(),
            args.join(" "),
            err.trim().lines().last().unwrap_or("failed")
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wall_stands_past_the_limit_so_a_crossing_is_seen() {
        assert_eq!(hard_limit(64 << 20), (64 << 20) + (32 << 20));
        assert_eq!(hard_limit(10 << 30), (10 << 30) + (320 << 20));
        assert_eq!(hard_limit(u64::MAX), u64::MAX);
    }

    #[test]
    fn a_filesystem_without_quotas_is_refused_only_when_one_is_required() {
        let dir = tempfile::tempdir().unwrap();
        let btrfs = Path::new("btrfs");
        assert!(
            DiskQuota::detect(QuotaMode::Off, dir.path(), btrfs)
                .unwrap()
                .is_none()
        );
        // The test host's temp dir is not btrfs with quotas (the btrfs case is the
        // integration test `disk_quota`, on a loop-mounted btrfs).
        if rustix::fs::statfs(dir.path()).unwrap().f_type as u64 != BTRFS_MAGIC {
            assert!(
                DiskQuota::detect(QuotaMode::Auto, dir.path(), btrfs)
                    .unwrap()
                    .is_none()
            );
            let err = DiskQuota::detect(QuotaMode::Required, dir.path(), btrfs).unwrap_err();
            assert!(err.contains("FORKYARD_SANDBOX_DISK_QUOTA"), "{err}");
            assert!(err.contains("not on btrfs"), "{err}");
        }
    }
}
