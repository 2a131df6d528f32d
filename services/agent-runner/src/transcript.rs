//! The runner's artifact store: each fork's conversation as JSON lines under
//! `<state dir>/artifacts/<run id>/fork-<n>/attempt-<a>.jsonl`. Transcripts are never
//! put into Temporal payloads (2 MB limit); `GetTranscript` serves them. Keys are
//! object-store shaped (`<run>/fork-<n>/attempt-<a>.jsonl`), so a bucket could replace
//! the directory without changing callers.
//!
//! Lines: `{"type":"start",…}`, `{"type":"message","turn":n,"message":<wire message>}`,
//! `{"type":"usage","turn":n,…}`, `{"type":"tool","turn":n,"name":…,"is_error":…}`,
//! `{"type":"resume",…}`, `{"type":"end",…}`.

use serde_json::Value;
use std::{
    io::Write,
    path::{Path, PathBuf},
};

/// Largest transcript GetTranscript returns whole (gRPC messages stay well under 64 MiB).
pub const MAX_SERVED_BYTES: usize = 16 << 20;

#[derive(Debug, Clone)]
pub struct ArtifactStore {
    root: PathBuf,
}

/// Run ids reach paths: only the characters the gateway issues pass.
fn safe(run_id: &str) -> bool {
    !run_id.is_empty()
        && run_id.len() <= 200
        && run_id != "."
        && run_id != ".."
        && run_id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
}

impl ArtifactStore {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    pub fn key(run_id: &str, fork: u32, attempt: u32) -> Option<String> {
        safe(run_id).then(|| {
            format!(
                "{}/attempt-{}.jsonl",
                forkyard_proto::ids::ForkId::new(run_id, fork),
                attempt.max(1)
            )
        })
    }

    fn path(&self, key: &str) -> PathBuf {
        self.root.join(key)
    }

    /// Open (append) the transcript under `key`.
    pub fn open(&self, key: &str) -> std::io::Result<Transcript> {
        let path = self.path(key);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)?;
        Ok(Transcript {
            file: Some(file),
            key: key.to_owned(),
        })
    }

    /// The lines already under `key` (a retried attempt resumes from them).
    pub fn read_lines(&self, key: &str) -> Vec<Value> {
        std::fs::read_to_string(self.path(key))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// The transcript of `fork` of `run_id` (latest attempt when `attempt` is 0).
    pub fn get(&self, run_id: &str, fork: u32, attempt: u32) -> Option<(u32, String, bool)> {
        if !safe(run_id) {
            return None;
        }
        let attempt = if attempt > 0 {
            attempt
        } else {
            latest_attempt(
                &self
                    .root
                    .join(run_id)
                    .join(forkyard_proto::ids::ForkId::segment(fork)),
            )?
        };
        let text = std::fs::read_to_string(self.path(&Self::key(run_id, fork, attempt)?)).ok()?;
        if text.len() > MAX_SERVED_BYTES {
            let mut end = MAX_SERVED_BYTES;
            while !text.is_char_boundary(end) {
                end -= 1;
            }
            let cut = text[..end].rfind('\n').map_or(0, |i| i + 1);
            return Some((attempt, text[..cut].to_owned(), true));
        }
        Some((attempt, text, false))
    }
}

fn latest_attempt(dir: &Path) -> Option<u32> {
    std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .filter_map(|e| {
            e.file_name()
                .to_str()?
                .strip_prefix("attempt-")?
                .strip_suffix(".jsonl")?
                .parse()
                .ok()
        })
        .max()
}

/// An open transcript. Writing is best effort: a full disk must not fail the agent.
pub struct Transcript {
    file: Option<std::fs::File>,
    pub key: String,
}

impl Transcript {
    /// No file (no artifact store configured, or it could not be opened).
    pub fn none() -> Self {
        Self {
            file: None,
            key: String::new(),
        }
    }

    pub fn write(&mut self, event: &Value) {
        let Some(f) = self.file.as_mut() else { return };
        let mut line = event.to_string();
        line.push('\n');
        if let Err(e) = f.write_all(line.as_bytes()) {
            tracing::warn!(key = %self.key, error = %e, "transcript write failed; continuing without it");
            self.file = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn writes_reads_and_serves_the_latest_attempt() {
        let dir = tempfile::tempdir().unwrap();
        let store = ArtifactStore::new(dir.path());
        for attempt in [1, 2] {
            let key = ArtifactStore::key("run-a", 3, attempt).unwrap();
            let mut t = store.open(&key).unwrap();
            t.write(&json!({"type": "start", "attempt": attempt}));
        }
        let (a, text, cut) = store.get("run-a", 3, 0).unwrap();
        assert_eq!((a, cut), (2, false));
        assert!(text.contains("\"attempt\":2"));
        assert_eq!(store.read_lines("run-a/fork-3/attempt-1.jsonl").len(), 1);
        assert!(store.get("run-a", 4, 0).is_none());
        assert!(ArtifactStore::key("../etc", 1, 1).is_none());
        assert!(store.get("..", 1, 1).is_none());
    }
}
