//! The cache's size bound: images removed least recently used first until the cache
//! fits, never one a live sandbox runs on, nor one used in the last [`GRACE`] (a create
//! may be between resolving its image and registering its sandbox).

use super::{ImageCache, Saved};
use crate::local::{
    base::{lru, lru::Entry},
    storage::store,
};
use std::{
    collections::HashSet,
    time::{Duration, SystemTime},
};

pub const GRACE: Duration = Duration::from_secs(600);

impl ImageCache {
    pub(super) fn grew(&self) {
        self.grown.store(true, std::sync::atomic::Ordering::Release);
    }

    /// Whether an image may have been unpacked since the last call.
    pub fn take_grown(&self) -> bool {
        self.grown.swap(false, std::sync::atomic::Ordering::AcqRel)
    }

    /// Note that the image `digest` was just used.
    pub(super) fn touch(&self, digest: &str) {
        self.used
            .lock()
            .expect("images lock")
            .insert(digest.to_owned(), SystemTime::now());
    }

    /// Remove images until the cache holds at most `max_bytes` (0: no bound), sparing
    /// those `in_use` (digests) and those used within `grace` (`GRACE` but in tests).
    /// Blocking (it walks directories). The digests removed.
    pub fn evict(&self, max_bytes: u64, in_use: &HashSet<String>, grace: Duration) -> Vec<String> {
        use std::sync::atomic::Ordering;
        if max_bytes == 0 || self.evicting.swap(true, Ordering::AcqRel) {
            return Vec::new();
        }
        let removed = self.evict_now(max_bytes, in_use, grace);
        self.evicting.store(false, Ordering::Release);
        removed
    }

    fn evict_now(&self, max_bytes: u64, in_use: &HashSet<String>, grace: Duration) -> Vec<String> {
        let mut entries = self.entries();
        for e in &mut entries {
            e.spared = in_use.contains(&e.key);
        }
        let root = self.root.clone();
        let done = lru::evict(entries, max_bytes, grace, |_| {
            root.join(format!(".tmp-evict-{}", uuid::Uuid::new_v4().simple()))
        });
        for e in &done.removed {
            self.forget(&e.key);
            tracing::info!(digest = %e.key, bytes = e.bytes, "image evicted from the cache");
        }
        if let Some(bytes) = done.over {
            tracing::warn!(
                bytes,
                max_bytes,
                "image cache over its bound: every image left is in use or recently used"
            );
        }
        done.removed.into_iter().map(|e| e.key).collect()
    }

    fn entries(&self) -> Vec<Entry> {
        let used = self.used.lock().expect("images lock").clone();
        let Ok(dir) = std::fs::read_dir(&self.root) else {
            return Vec::new();
        };
        dir.flatten()
            .filter(|d| !d.file_name().to_string_lossy().starts_with('.'))
            .filter_map(|d| {
                let home = d.path();
                let meta_path = home.join("image.json");
                let saved: Saved = serde_json::from_slice(&std::fs::read(&meta_path).ok()?).ok()?;
                let bytes = if saved.bytes > 0 {
                    saved.bytes
                } else {
                    store::disk_usage(&home)
                };
                let used = used.get(&saved.digest).copied().unwrap_or_else(|| {
                    std::fs::metadata(&meta_path)
                        .and_then(|m| m.modified())
                        .unwrap_or(SystemTime::UNIX_EPOCH)
                });
                Some(Entry {
                    key: saved.digest,
                    home,
                    bytes,
                    used,
                    spared: false,
                })
            })
            .collect()
    }

    /// Drop what the memos say about `digest`.
    fn forget(&self, digest: &str) {
        self.loaded
            .lock()
            .expect("images lock")
            .retain(|_, img| img.digest != digest);
        self.pulled
            .lock()
            .expect("images lock")
            .retain(|_, (img, _)| img.digest != digest);
        self.used.lock().expect("images lock").remove(digest);
    }
}
