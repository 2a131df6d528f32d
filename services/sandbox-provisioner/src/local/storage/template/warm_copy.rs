//! One warm copy of a template's workspace, and how it is made (`super::warm`'s pool
//! decides how many and when): the template's workspace copied, or a sandbox directory
//! with an overlay of it mounted ahead, under a `.tmp` name until it is whole.

use super::marks::BYTES;
use crate::local::{
    base::fs::remove_all,
    isolation::{uids, uids::SandboxUids},
    storage::{
        layout::{RECORD, UPPER, WORKSPACE, sandbox_dir_mode},
        overlay,
        repo::git_index,
        store,
        template::{copy, copy::copy_workspace},
    },
};
use std::{
    os::unix::fs::DirBuilderExt as _,
    path::{Path, PathBuf},
    sync::Arc,
};

/// Where a template's copies are, inside its directory.
pub(crate) const DIR: &str = "warm";
/// What a warm overlay takes on the disk (its directories and empty files), counted
/// against the copies' bytes bound in place of a worktree's.
const OVERLAY_BYTES: u64 = 32 << 10;
/// In a copy's `.git/refs/heads/`: the file a create renames to its branch's ref (a
/// name no branch can have: a ref's parts never start with a dot).
pub(crate) const BRANCH_FILE: &str = ".forkyard-branch";

/// A sandbox directory made ahead ([`skeleton`]), ready to be renamed into place; with its sandbox uid when the
/// replica hands uids out (claimed, and the copy given to it, ahead of time too: a
/// `chown` per file was a tenth of a create). Dropped, it gives its uid back.
#[derive(Debug)]
pub(crate) struct WarmCopy {
    pub(crate) path: PathBuf,
    /// The checksum of its `.git/index` (the sandbox record's `made_index`).
    pub(crate) index: String,
    uid: u32,
    uids: Option<Arc<SandboxUids>>,
    /// A warm overlay's mount, and its lower layer (`crate::local::storage::overlay`); `None`: a
    /// copy of the worktree.
    pub(crate) mount: Option<(rustix::fd::OwnedFd, PathBuf)>,
}

impl WarmCopy {
    /// No copy made ahead: a sandbox uid claimed now (when the replica hands uids out)
    /// for the copy about to be made at `path`, given back if it is dropped.
    pub(crate) fn holding_uid(
        path: PathBuf,
        uids: Option<&Arc<SandboxUids>>,
    ) -> crate::error::Result<Self> {
        let uid = match uids {
            Some(u) => u.claim()?,
            None => 0,
        };
        Ok(Self {
            path,
            index: String::new(),
            uid,
            uids: uids.cloned(),
            mount: None,
        })
    }

    /// The sandbox uid its files are given to, if any.
    pub(crate) fn uid(&self) -> Option<u32> {
        (self.uid != 0).then_some(self.uid)
    }

    /// Its sandbox uid (0: none), now the sandbox's to give back.
    pub(crate) fn keep_uid(mut self) -> (String, u32) {
        self.uids = None;
        (std::mem::take(&mut self.index), self.uid)
    }
}

impl Drop for WarmCopy {
    fn drop(&mut self) {
        if let Some(uids) = &self.uids
            && self.uid != 0
        {
            uids.release(self.uid);
        }
    }
}

/// Copy `template`'s workspace into its `warm/` directory: under a `.tmp` name first, so
/// a half-made copy is never taken (and is swept at start-up with the rest). With the
/// bytes it takes on the disk.
pub(super) fn make_copy(
    template: &Path,
    uids: Option<&Arc<SandboxUids>>,
    overlays: Option<&Arc<overlay::Overlays>>,
) -> std::io::Result<(WarmCopy, u64)> {
    let bytes: u64 = std::fs::read_to_string(template.join(BYTES))?
        .trim()
        .parse()
        .map_err(std::io::Error::other)?;
    let dir = template.join(DIR);
    match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
        // Spread as the sandboxes' directories are (`store::spread_subdirectories`):
        // a copy is made where the inodes of the sandboxes destroyed before it were
        // freed, and packed into one group each new inode stepped over all of them.
        Ok(()) => store::spread_subdirectories(&dir),
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => return Err(e),
        Err(_) => {}
    }
    let name = uuid::Uuid::new_v4().simple().to_string();
    let (tmp, path) = (dir.join(format!("{name}.tmp")), dir.join(&name));
    let mut copy = WarmCopy {
        path: tmp.clone(),
        index: String::new(),
        uid: 0,
        uids: uids.cloned(),
        mount: None,
    };
    let made = match overlays {
        Some(o) => overlay_skeleton(template, &tmp, &mut copy, o),
        None => skeleton(template, &tmp, &mut copy),
    }
    .and_then(|()| std::fs::rename(&tmp, &path));
    if let Err(e) = made {
        drop(copy.mount.take());
        let _ = remove_all(&tmp);
        return Err(e);
    }
    if copy.mount.is_some() {
        copy.path = path;
        return Ok((copy, OVERLAY_BYTES));
    }
    // What the copy shares with its template takes no disk of its own.
    let shared = copy::shared_bytes(&path.join(WORKSPACE));
    copy.path = path;
    Ok((copy, bytes.saturating_sub(shared)))
}

/// A sandbox's directory as a create makes it, at `dir`: the template's workspace, and
/// every file the create would make new, empty (its record, its branch's ref): a new
/// inode is the dearest part of a file on ext4 without a journal (each steps over the
/// inodes freed in the last minutes), and a wave's creates then make none.
fn skeleton(template: &Path, dir: &Path, copy: &mut WarmCopy) -> std::io::Result<()> {
    let own_uids = copy.uids.is_some();
    std::fs::DirBuilder::new()
        .mode(sandbox_dir_mode(own_uids))
        .create(dir)?;
    let ws = dir.join(WORKSPACE);
    if let Some(uids) = &copy.uids {
        copy.uid = uids.claim().map_err(std::io::Error::other)?;
    }
    let uid = copy.uid();
    copy_workspace(&template.join("workspace"), &ws, uid)?;
    copy.index = git_index::checksum_of(&ws)
        .ok_or_else(|| std::io::Error::other("the copy has no readable index"))?;
    let branch = std::fs::File::create_new(ws.join(".git/refs/heads").join(BRANCH_FILE))?;
    std::fs::File::create_new(dir.join(RECORD))?;
    if let Some(uid) = uid {
        uids::give_file(&branch, uid)?;
    }
    Ok(())
}

/// A sandbox's directory as an overlay create makes it, at `dir`, mounted: its layers,
/// and in its own layer what a create writes (git's directories down to the branch's
/// ref, the ref's placeholder, `HEAD` to be overwritten in place), with its empty
/// record. A create then makes no inode and copies nothing up.
fn overlay_skeleton(
    template: &Path,
    dir: &Path,
    copy: &mut WarmCopy,
    overlays: &overlay::Overlays,
) -> std::io::Result<()> {
    use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
    std::fs::DirBuilder::new()
        .mode(sandbox_dir_mode(true))
        .create(dir)?;
    let uids = copy
        .uids
        .as_ref()
        .ok_or_else(|| std::io::Error::other("overlays need a uid per sandbox"))?;
    copy.uid = uids.claim().map_err(std::io::Error::other)?;
    let uid = copy.uid;
    let lower = template.join(WORKSPACE);
    overlay::make_layers(dir, uid)?;
    let upper = dir.join(UPPER);
    for part in [".git", ".git/refs", ".git/refs/heads"] {
        let mode = std::fs::metadata(lower.join(part)).map_or(0o755, |m| m.mode() & 0o7777);
        std::fs::DirBuilder::new()
            .mode(mode)
            .create(upper.join(part))?;
        uids::chown(&upper.join(part), uid)?;
    }
    let branch = std::fs::File::create_new(upper.join(".git/refs/heads").join(BRANCH_FILE))?;
    uids::give_file(&branch, uid)?;
    let head = lower.join(".git/HEAD");
    let mut to = std::fs::File::create_new(upper.join(".git/HEAD"))?;
    std::io::copy(&mut std::fs::File::open(&head)?, &mut to)?;
    uids::give_file(&to, uid)?;
    to.set_permissions(std::fs::Permissions::from_mode(
        std::fs::metadata(&head)?.mode() & 0o777,
    ))?;
    std::fs::File::create_new(dir.join(RECORD))?;
    copy.index = git_index::checksum_of(&lower)
        .ok_or_else(|| std::io::Error::other("the template has no readable index"))?;
    copy.mount = Some((overlays.detached(&lower, dir, uid)?, lower));
    Ok(())
}
