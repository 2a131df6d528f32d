//! The workspace templates' size bound: after a template is built, least recently used
//! templates are removed until the templates fit, never one used in the last
//! [`GRACE`] (a create may be between finding its template and copying it; one that
//! lost the race clones instead). `FORKYARD_TEMPLATE_CACHE_MAX_BYTES`.

use super::{
    GRACE, Templates, Used,
    marks::{BYTES, READY},
};
use crate::local::{
    base::{lru, lru::Entry},
    storage::store,
};
use std::{
    path::Path,
    sync::atomic::Ordering,
    time::{Duration, SystemTime},
};

impl Templates {
    pub(crate) fn touch(&self, key: &str) {
        self.used
            .lock()
            .expect("templates lock")
            .insert(key.to_owned(), SystemTime::now());
    }

    /// Keep the templates within their bound, on a blocking thread (it walks directories),
    /// one eviction at a time.
    pub(crate) fn evict_in_the_background(&self) {
        if self.max_bytes == 0 || self.evicting.swap(true, Ordering::AcqRel) {
            return;
        }
        let (root, max) = (self.root.clone(), self.max_bytes);
        let (used, evicting) = (self.used.clone(), self.evicting.clone());
        let overlays = self.overlays.clone();
        tokio::task::spawn_blocking(move || {
            let mut found = entries(&root, &used);
            // A live overlay's lower layer counts as used now.
            for e in &mut found {
                if overlays.uses(&e.home) {
                    e.used = SystemTime::now();
                }
            }
            let removed = evict(&root, found, max, GRACE);
            let mut memo = used.lock().expect("templates lock");
            for key in removed {
                memo.remove(&key);
            }
            evicting.store(false, Ordering::Release);
        });
    }
}

/// The ready templates under `root`, with their sizes and last uses.
fn entries(root: &Path, used: &Used) -> Vec<Entry> {
    let used = used.lock().expect("templates lock").clone();
    let Ok(dir) = std::fs::read_dir(root) else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|d| {
            let key = d.file_name().to_str()?.to_owned();
            let home = d.path();
            if key.contains(".tmp-") || !home.join(READY).is_file() {
                return None;
            }
            // Its warm copies (`warm`) are as large as its workspace, and go with it.
            let copies =
                std::fs::read_dir(home.join(super::warm_copy::DIR)).map_or(0, Iterator::count);
            let bytes = std::fs::read_to_string(home.join(BYTES))
                .ok()
                .and_then(|b| b.trim().parse::<u64>().ok())
                .map(|b| b * (1 + copies as u64))
                .unwrap_or_else(|| store::disk_usage(&home));
            let used = used.get(&key).copied().unwrap_or_else(|| {
                std::fs::metadata(home.join(READY))
                    .and_then(|m| m.modified())
                    .unwrap_or(SystemTime::UNIX_EPOCH)
            });
            Some(Entry {
                key,
                home,
                bytes,
                used,
                spared: false,
            })
        })
        .collect()
}

/// Remove least recently used templates until `max_bytes` fit, sparing those used within
/// `grace`. The keys removed.
fn evict(root: &Path, entries: Vec<Entry>, max_bytes: u64, grace: Duration) -> Vec<String> {
    // Out of the templates' namespace first (a `.tmp-` name, swept at start-up too).
    let done = lru::evict(entries, max_bytes, grace, |e| {
        root.join(format!(
            "{}.tmp-evict-{}",
            e.key,
            uuid::Uuid::new_v4().simple()
        ))
    });
    for e in &done.removed {
        tracing::info!(template = %e.key, bytes = e.bytes, "workspace template evicted");
    }
    if let Some(bytes) = done.over {
        tracing::warn!(
            bytes,
            max_bytes,
            "workspace templates over their bound: every one left was used recently"
        );
    }
    done.removed.into_iter().map(|e| e.key).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn template(root: &Path, key: &str, bytes: u64) {
        let home = root.join(key);
        std::fs::create_dir_all(home.join("workspace")).unwrap();
        std::fs::write(home.join(BYTES), bytes.to_string()).unwrap();
        std::fs::write(home.join(READY), "c0ffee").unwrap();
    }

    #[test]
    fn least_recently_used_go_first_and_recent_ones_stay() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        for key in ["a", "b", "c"] {
            template(root, key, 100);
        }
        // Being built: never counted nor removed.
        std::fs::create_dir_all(root.join("d.tmp-1234")).unwrap();
        let used = Used::default();
        let now = SystemTime::now();
        {
            let mut m = used.lock().unwrap();
            m.insert("a".into(), now - Duration::from_secs(3000));
            m.insert("b".into(), now - Duration::from_secs(2000));
            m.insert("c".into(), now - Duration::from_secs(1000));
        }
        // All used within the grace: none goes, however far over the bound.
        assert!(evict(root, entries(root, &used), 1, Duration::from_secs(5000)).is_empty());
        let removed = evict(root, entries(root, &used), 150, Duration::ZERO);
        assert_eq!(removed, ["a", "b"]);
        let mut left: Vec<String> = std::fs::read_dir(root)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(left, ["c", "d.tmp-1234"]);
        // Within the bound: nothing to do.
        assert!(evict(root, entries(root, &used), 100, Duration::ZERO).is_empty());
    }
}
