//! The one rule of a file shared between copies of a template: the provisioner's own,
//! and linked from more than one place. Asked where a tree is given to a sandbox's uid,
//! measured, copied or written, none of which may touch such a file as a sandbox's.

use std::{fs, os::unix::fs::MetadataExt};

/// Whether `meta` is a file shared between copies of a template (`crate::local::storage::template::copy` says why): the
/// provisioner's own, and linked from more than one place. One that no other place
/// holds any more (its template is gone) can be given to its sandbox safely.
pub(crate) fn is_shared(meta: &fs::Metadata) -> bool {
    meta.is_file() && shared_by(meta.nlink(), meta.uid())
}

/// [`is_shared`] for a file's `fstat`.
pub(crate) fn is_shared_stat(stat: &rustix::fs::Stat) -> bool {
    rustix::fs::FileType::from_raw_mode(stat.st_mode) == rustix::fs::FileType::RegularFile
        && shared_by(stat.st_nlink, stat.st_uid)
}

fn shared_by(links: u64, owner: u32) -> bool {
    links > 1 && owner == rustix::process::geteuid().as_raw()
}
