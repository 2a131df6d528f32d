//! Host uids for sandboxes. A user namespace maps the sandbox's uid to the uid of the
//! process that starts bubblewrap, so a provisioner running as root ran every sandbox as
//! host root: a file an agent wrote was root's, and anything that got out of the
//! namespaces landed as root. Run as root, the provisioner gives each sandbox a uid of
//! its own from a range no host user has (`FORKYARD_SANDBOX_UID_BASE`, `..._COUNT`):
//! its workspace is owned by that uid, its relay sockets too, and every command of the
//! sandbox drops to it (`crate::local::isolation::bubblewrap::enter`) after joining the sandbox's cgroups and before
//! bubblewrap starts. An escape lands as a uid that owns nothing but that one workspace,
//! and sandboxes cannot reach each other's files. A provisioner that is not root (its
//! container image runs it as 65532) already runs sandboxes as itself.

use crate::{
    error::{ProvisionerError, Result},
    local::base::{fd_walk, shared::is_shared_stat},
};
use std::{collections::BTreeSet, os::unix::fs::PermissionsExt as _, path::Path, sync::Mutex};

/// The default range: far above any uid a host hands out (useradd stops at 60000,
/// subordinate ranges for rootless containers start at 100000 and rarely pass 10^8).
pub const DEFAULT_BASE: u32 = 1_000_000_000;
pub const DEFAULT_COUNT: u32 = 100_000;

/// The uids this replica hands out, and which are in use.
#[derive(Debug)]
pub struct SandboxUids {
    base: u32,
    count: u32,
    used: Mutex<BTreeSet<u32>>,
}

impl SandboxUids {
    /// The range `base..base + count`; `None` when `base` is 0 (off) or the provisioner
    /// is not root (sandboxes run as its own uid then).
    pub fn new(base: u32, count: u32) -> Option<Self> {
        (base != 0 && rustix::process::geteuid().is_root()).then(|| Self {
            base,
            count,
            used: Mutex::default(),
        })
    }

    /// Check a configured range: outside the uids hosts give users and below the
    /// kernel's invalid uid.
    pub fn check(base: u32, count: u32) -> std::result::Result<(), String> {
        if base == 0 {
            return Ok(());
        }
        if base < 65_536 {
            return Err("--sandbox-uid-base (FORKYARD_SANDBOX_UID_BASE) must be 0 (off) or at least 65536: lower uids belong to the host's users".into());
        }
        if count == 0 || u64::from(base) + u64::from(count) > u64::from(u32::MAX - 1) {
            return Err("--sandbox-uid-count (FORKYARD_SANDBOX_UID_COUNT) must be at least 1 and keep the range below 4294967294".into());
        }
        Ok(())
    }

    /// The lowest uid of the range not in use, now in use.
    pub fn claim(&self) -> Result<u32> {
        let mut used = self.used.lock().expect("uids lock");
        let free = (self.base..self.base + self.count)
            .find(|u| !used.contains(u))
            .ok_or_else(|| {
                ProvisionerError::Unavailable(format!(
                    "every sandbox uid of this replica is in use ({} from {}): destroy sandboxes or raise FORKYARD_SANDBOX_UID_COUNT",
                    self.count, self.base
                ))
            })?;
        used.insert(free);
        Ok(free)
    }

    /// Mark `uid` in use (a sandbox adopted after a restart); false when it is not of
    /// this range or already taken.
    pub fn hold(&self, uid: u32) -> bool {
        (self.base..self.base + self.count).contains(&uid)
            && self.used.lock().expect("uids lock").insert(uid)
    }

    /// Whether half the range or more is in use: what warm copies may claim ahead of
    /// time stops there, so creates always find uids (`template::warm`).
    pub fn half_used(&self) -> bool {
        let used = self.used.lock().expect("uids lock").len();
        u64::try_from(used).unwrap_or(u64::MAX) * 2 >= u64::from(self.count)
    }

    pub fn release(&self, uid: u32) {
        self.used.lock().expect("uids lock").remove(&uid);
    }
}

/// Give `root` and everything under it to `uid` (symlinks themselves, never what they
/// point at).
pub fn chown_tree(root: &Path, uid: u32) -> std::io::Result<()> {
    // By descriptor (`fd_walk`): what is checked as shared is what is left alone, and a
    // directory swapped for a symlink is given (the link itself), never walked through.
    fd_walk::walk(root, |entry| {
        // A git object file shared with the template's other copies stays the
        // provisioner's (`template::copy`): given to one uid, it could change all.
        if entry.is_file() && is_shared_stat(entry.stat) {
            return Ok(false);
        }
        entry.chown(uid)?;
        Ok(true)
    })
}

/// Give a workspace to `uid`, readable by it alone (its directory's parents let other
/// uids through).
pub fn give_workspace(ws: &Path, uid: u32) -> std::io::Result<()> {
    chown_tree(ws, uid)?;
    owner_only(ws)
}

/// A workspace given to its uid is readable by it alone.
pub fn owner_only(ws: &Path) -> std::io::Result<()> {
    std::fs::set_permissions(ws, std::fs::Permissions::from_mode(0o700))
}

/// Give the open file `file` to `uid` (one made for the sandbox, never another by path).
pub fn give_file(file: &impl std::os::fd::AsFd, uid: u32) -> std::io::Result<()> {
    rustix::fs::fchown(
        file,
        Some(rustix::fs::Uid::from_raw(uid)),
        Some(rustix::fs::Gid::from_raw(uid)),
    )?;
    Ok(())
}

/// Give one file (a socket, a file written for a caller) to `uid`; a symlink itself,
/// never what it points at.
pub fn chown(path: &Path, uid: u32) -> std::io::Result<()> {
    rustix::fs::chownat(
        rustix::fs::CWD,
        path,
        Some(rustix::fs::Uid::from_raw(uid)),
        Some(rustix::fs::Gid::from_raw(uid)),
        rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
    )?;
    Ok(())
}

/// A copy of the executable `bin` as `dir/<name>` (`dir` made 0711), readable and
/// executable by any uid: replaced when its content differs, so an upgraded binary is
/// what sandboxes run.
pub fn reachable_copy(bin: &Path, dir: &Path, name: &str) -> std::io::Result<std::path::PathBuf> {
    std::fs::create_dir_all(dir)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o711))?;
    let to = dir.join(name);
    let wanted = std::fs::read(bin)?;
    if std::fs::read(&to).ok().as_deref() != Some(wanted.as_slice()) {
        let tmp = dir.join(format!(".{name}.tmp"));
        std::fs::write(&tmp, &wanted)?;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755))?;
        std::fs::rename(&tmp, &to)?;
    }
    Ok(to)
}

/// Let other uids pass through `dir` (search only, no listing): a sandbox's bubblewrap,
/// running as the sandbox's uid, opens its workspace by path.
pub fn let_through(dir: &Path) -> std::io::Result<()> {
    let mode = std::fs::metadata(dir)?.permissions().mode() & 0o7777;
    if mode & 0o011 != 0o011 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode | 0o011))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_outside_the_hosts_users_are_accepted() {
        assert!(SandboxUids::check(0, 0).is_ok(), "0 is off");
        assert!(SandboxUids::check(DEFAULT_BASE, DEFAULT_COUNT).is_ok());
        let low = SandboxUids::check(1000, 10).unwrap_err();
        assert!(low.contains("FORKYARD_SANDBOX_UID_BASE"), "{low}");
        let wide = SandboxUids::check(u32::MAX - 10, 100).unwrap_err();
        assert!(wide.contains("FORKYARD_SANDBOX_UID_COUNT"), "{wide}");
    }

    #[test]
    fn uids_are_handed_out_once_and_come_back() {
        let u = SandboxUids {
            base: 2_000_000,
            count: 3,
            used: Mutex::default(),
        };
        assert!(u.hold(2_000_001));
        assert!(!u.hold(2_000_001), "taken twice");
        assert!(!u.hold(5), "outside the range");
        assert_eq!(u.claim().unwrap(), 2_000_000);
        assert_eq!(u.claim().unwrap(), 2_000_002);
        let full = u.claim().unwrap_err();
        assert!(
            full.to_string().contains("FORKYARD_SANDBOX_UID_COUNT"),
            "{full}"
        );
        u.release(2_000_000);
        assert_eq!(u.claim().unwrap(), 2_000_000);
    }

    #[test]
    fn a_binary_gets_a_copy_any_uid_can_run() {
        use std::os::unix::fs::PermissionsExt as _;
        let d = tempfile::tempdir().unwrap();
        let locked = d.path().join("locked");
        std::fs::create_dir(&locked).unwrap();
        std::fs::write(locked.join("fwd"), b"v1").unwrap();
        std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o700)).unwrap();
        let bin = d.path().join("state/bin");
        let copy = reachable_copy(&locked.join("fwd"), &bin, "fwd").unwrap();
        assert_eq!(copy, bin.join("fwd"));
        assert_eq!(std::fs::read(&copy).unwrap(), b"v1");
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!((mode(&bin), mode(&copy)), (0o711, 0o755));
        // An upgraded binary replaces the copy; the same one leaves it alone.
        std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::write(locked.join("fwd"), b"v2").unwrap();
        reachable_copy(&locked.join("fwd"), &bin, "fwd").unwrap();
        assert_eq!(std::fs::read(&copy).unwrap(), b"v2");
    }

    #[test]
    fn a_tree_is_given_away_without_following_links() {
        if !forkyard_common::testing::requires(
            forkyard_common::testing::Need::Root,
            rustix::process::geteuid().is_root(),
            "chown",
        ) {
            return;
        }
        use std::os::unix::fs::MetadataExt as _;
        let d = tempfile::tempdir().unwrap();
        let outside = d.path().join("outside");
        std::fs::write(&outside, "x").unwrap();
        let ws = d.path().join("ws");
        std::fs::create_dir_all(ws.join("a/b")).unwrap();
        std::fs::write(ws.join("a/b/f"), "y").unwrap();
        std::os::unix::fs::symlink(&outside, ws.join("link")).unwrap();
        chown_tree(&ws, 2_000_123).unwrap();
        for p in ["", "a", "a/b", "a/b/f", "link"] {
            let m = std::fs::symlink_metadata(ws.join(p)).unwrap();
            assert_eq!((m.uid(), m.gid()), (2_000_123, 2_000_123), "{p}");
        }
        assert_eq!(
            std::fs::metadata(&outside).unwrap().uid(),
            0,
            "link target kept"
        );
    }
}
