//! A sandbox's disk limit while a command runs: its workspace is measured every few
//! seconds and the command is stopped once the workspace is larger than the limit.
//!
//! The watch runs on every filesystem; where there is a hard quota too
//! (`crate::local::storage::disk_quota`, btrfs) it is the wall a fast writer meets, and the watch still
//! names the crossing. Without a quota (ext4, XFS here: see that module) the watch is
//! all there is. Without it an agent that wrote past its limit (`fallocate -l 12G`) held
//! the host's disk until the fork's destroy, and the patch step then spent a minute
//! hashing the file. The watch stops it within a few seconds of the crossing; what it
//! wrote in those seconds is on disk until the sandbox is destroyed.

use crate::local::storage::store;
use std::{
    path::PathBuf,
    time::{Duration, Instant},
};

/// Shortest time between two measurements.
const MIN_INTERVAL: Duration = Duration::from_secs(1);
/// Longest: a very large workspace is still measured this often.
const MAX_INTERVAL: Duration = Duration::from_secs(30);
/// A measurement may take at most this share of the time (a workspace that takes
/// 300 ms to walk is walked every 3 s).
const WALK_SHARE: u32 = 10;

/// Resolves with the workspace's size once it is larger than `limit` bytes; never
/// when `limit` is 0 (no limit).
pub(crate) async fn over_limit(workspace: PathBuf, limit: u64) -> u64 {
    if limit == 0 {
        return std::future::pending().await;
    }
    let mut every = MIN_INTERVAL;
    loop {
        tokio::time::sleep(every).await;
        let started = Instant::now();
        let ws = workspace.clone();
        let over = tokio::task::spawn_blocking(move || store::disk_usage_over(&ws, limit))
            .await
            .ok()
            .flatten();
        if let Some(bytes) = over {
            return bytes;
        }
        every = (started.elapsed() * WALK_SHARE).clamp(MIN_INTERVAL, MAX_INTERVAL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_workspace_that_grows_past_its_limit_is_noticed_and_one_within_it_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let ws = dir.path().to_path_buf();
        std::fs::write(ws.join("small"), vec![1u8; 64 << 10]).unwrap();
        let within =
            tokio::time::timeout(Duration::from_millis(2500), over_limit(ws.clone(), 1 << 20))
                .await;
        assert!(within.is_err(), "64 KiB is within 1 MiB");

        let watch = tokio::spawn(over_limit(ws.clone(), 1 << 20));
        // Allocated blocks count, as `fallocate` makes them: not only written bytes.
        let big = std::fs::File::create(ws.join("big")).unwrap();
        big.set_len(4 << 20).unwrap();
        std::process::Command::new("fallocate")
            .args(["-l", "4M"])
            .arg(ws.join("big"))
            .status()
            .unwrap();
        let bytes = tokio::time::timeout(Duration::from_secs(10), watch)
            .await
            .expect("noticed")
            .unwrap();
        assert!(bytes > 1 << 20, "{bytes}");
    }

    #[tokio::test]
    async fn no_limit_never_resolves() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("f"), vec![1u8; 1 << 20]).unwrap();
        let r = tokio::time::timeout(
            Duration::from_millis(1500),
            over_limit(dir.path().to_path_buf(), 0),
        )
        .await;
        assert!(r.is_err());
    }
}
