//! What a directory, and a sandbox's workspace, occupy on disk: walked by descriptor,
//! for the disk limit's watch and the sandboxes' metrics.

use crate::local::base::shared::is_shared_stat;
use std::path::Path;

/// Bytes a directory tree occupies on disk (allocated blocks, symlinks not followed).
pub fn disk_usage(path: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return 0;
    };
    let mut total = meta.blocks() * 512;
    if meta.is_dir()
        && let Ok(entries) = std::fs::read_dir(path)
    {
        for e in entries.flatten() {
            total += disk_usage(&e.path());
        }
    }
    total
}

/// `Some(bytes counted)` as soon as a sandbox's workspace occupies more than `limit`
/// bytes (the walk stops there), `None` when it fits. Counted as [`workspace_usage`].
pub fn disk_usage_over(path: &Path, limit: u64) -> Option<u64> {
    let total = workspace_walk(path, limit);
    (total > limit).then_some(total)
}

/// Bytes a sandbox's workspace occupies on disk, as its disk limit sees them: a file with
/// several links once, and without the git object files it shares with its template's
/// other copies (`template::copy`), which are not its bytes. Shared files are skipped only
/// when the workspace is another uid's: then the provisioner's own multi-linked files in
/// it can only be those. Where a sandbox runs as the provisioner's uid nothing is shared,
/// and skipping its own linked files would let it hide bytes from its limit.
pub fn workspace_usage(path: &Path) -> u64 {
    workspace_walk(path, u64::MAX)
}

/// By descriptor ([`crate::local::base::fd_walk`]): the sandbox may be writing while it is counted, and
/// a directory swapped for a symlink to `/` must not make root walk the host's files.
/// What cannot be read is left out and the count goes on (an error must not end it
/// early: the sandbox could hide its bytes behind one), except a tree deeper than the
/// walk goes, which is over any limit: what is under it is never counted.
fn workspace_walk(path: &Path, limit: u64) -> u64 {
    use crate::local::base::fd_walk::{Skip, walk_with};
    let Ok(root) = std::fs::symlink_metadata(path) else {
        return 0;
    };
    let skip_shared =
        std::os::unix::fs::MetadataExt::uid(&root) != rustix::process::geteuid().as_raw();
    let mut linked = std::collections::HashSet::new();
    let mut total = 0u64;
    let mut too_deep = false;
    let walked = walk_with(
        path,
        |entry| {
            let st = entry.stat;
            if entry.is_file()
                && st.st_nlink > 1
                && ((skip_shared && is_shared_stat(st)) || !linked.insert((st.st_dev, st.st_ino)))
            {
                return Ok(false);
            }
            total = total.saturating_add(u64::try_from(st.st_blocks).unwrap_or(0) * 512);
            // Over: the count so far is the answer, the rest need not be read.
            if total > limit {
                return Err(std::io::Error::other("over the limit"));
            }
            Ok(true)
        },
        |rel, skip| match skip {
            Skip::TooDeep => {
                too_deep = true;
                Err(std::io::Error::other("too deep to count"))
            }
            Skip::Failed(e) => {
                tracing::debug!(dir = %path.display(), entry = %rel.display(), error = %e, "cannot count an entry of a workspace");
                Ok(())
            }
        },
    );
    match walked {
        // Too deep to count all of it: over whatever the limit.
        Err(_) if too_deep && limit != u64::MAX => total.max(limit + 1),
        Err(e) if total <= limit && !too_deep => {
            tracing::debug!(dir = %path.display(), error = %e, "cannot count a workspace");
            total
        }
        _ => total,
    }
}
