//! Least recently used first, under a size bound: what the image cache and the workspace
//! templates share. An entry is renamed out of its namespace before it is removed, so
//! nothing finds it half removed.

use crate::local::base::fs::remove_all;
use std::{
    path::PathBuf,
    time::{Duration, SystemTime},
};

/// One directory that may be removed.
pub(crate) struct Entry {
    /// What its owner knows it by (an image digest, a template key).
    pub(crate) key: String,
    pub(crate) home: PathBuf,
    pub(crate) bytes: u64,
    pub(crate) used: SystemTime,
    /// Never removed (a live sandbox runs on it).
    pub(crate) spared: bool,
}

/// What an eviction did.
pub(crate) struct Evicted {
    /// Removed, least recently used first.
    pub(crate) removed: Vec<Entry>,
    /// Still over the bound: everything left is spared or used within the grace.
    pub(crate) over: Option<u64>,
}

/// Remove `entries`, least recently used first, until they fit `max_bytes`, never a
/// spared one nor one used within `grace`. `aside(entry)` is where an entry is renamed
/// before its removal.
pub(crate) fn evict(
    mut entries: Vec<Entry>,
    max_bytes: u64,
    grace: Duration,
    aside: impl Fn(&Entry) -> PathBuf,
) -> Evicted {
    let mut total: u64 = entries.iter().map(|e| e.bytes).sum();
    let mut removed = Vec::new();
    if total <= max_bytes {
        return Evicted {
            removed,
            over: None,
        };
    }
    entries.sort_by_key(|e| e.used);
    let now = SystemTime::now();
    for e in entries {
        if total <= max_bytes {
            break;
        }
        if e.spared || now.duration_since(e.used).unwrap_or_default() < grace {
            continue;
        }
        let gone = aside(&e);
        if std::fs::rename(&e.home, &gone).is_err() {
            continue;
        }
        let _ = remove_all(&gone);
        total = total.saturating_sub(e.bytes);
        removed.push(e);
    }
    Evicted {
        removed,
        over: (total > max_bytes).then_some(total),
    }
}
