//! Patches collected under an idempotency key (`CollectPatchRequest.idempotency_key`),
//! kept on disk for a day: a repeated call gets the first answer back, byte for byte,
//! whether the sandbox still runs or was destroyed since.
//!
//! Why: the gateway's finish step collects a fork's patch, commits its spend and
//! destroys its sandbox, and a gateway killed after the destroy retries all three. The
//! retry used to find no sandbox (the fork turned FAILED, its patch lost) and, where
//! the sandbox was still there, a sandbox cost grown by the second collection (the
//! ledger refused the commit: the same key with another amount). With the first answer
//! recorded, the retry settles exactly what the first attempt did.
//!
//! A record is written (to a temporary name, then renamed) before the answer leaves, so
//! an answer a caller saw is one a retry finds; one file a key, named by the key's
//! digest. Records older than [`KEEP`] are removed as new ones are written.

use forkyard_proto::sandbox::v1::CollectPatchResponse;
use prost::Message as _;
use sha2::{Digest as _, Sha256};
use std::{
    path::{Path, PathBuf},
    sync::Mutex,
    time::{Duration, Instant, SystemTime},
};

/// How long an answer is kept: longer than any retry of a finish (its activity's
/// schedule-to-close and a gateway's restart).
pub const KEEP: Duration = Duration::from_secs(24 * 3600);
/// How often old records are looked for (on a write).
const SWEEP_EVERY: Duration = Duration::from_secs(600);

pub struct PatchRecords {
    dir: PathBuf,
    last_sweep: Mutex<Option<Instant>>,
}

impl PatchRecords {
    /// The records under `dir` (made 0700: patches are the tenants' code).
    pub fn open(dir: &Path) -> std::io::Result<Self> {
        use std::os::unix::fs::DirBuilderExt as _;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)?;
        Ok(Self {
            dir: dir.to_path_buf(),
            last_sweep: Mutex::new(None),
        })
    }

    fn path(&self, key: &str) -> PathBuf {
        self.dir
            .join(format!("{:x}", Sha256::digest(key.as_bytes())))
    }

    /// The answer recorded under `key` for `sandbox_id`; `Err` when the key was used
    /// for another sandbox.
    pub fn get(&self, key: &str, sandbox_id: &str) -> Result<Option<CollectPatchResponse>, String> {
        let Ok(raw) = std::fs::read(self.path(key)) else {
            return Ok(None);
        };
        let Some((owner, body)) = split(&raw) else {
            return Ok(None);
        };
        if owner != sandbox_id.as_bytes() {
            return Err("was used for another sandbox's patch".into());
        }
        Ok(CollectPatchResponse::decode(body).ok())
    }

    /// Record `answer` under `key` (blocking).
    pub fn put(
        &self,
        key: &str,
        sandbox_id: &str,
        answer: &CollectPatchResponse,
    ) -> std::io::Result<()> {
        use std::io::Write as _;
        let path = self.path(key);
        let tmp = path.with_extension(format!("tmp-{}", uuid::Uuid::new_v4().simple()));
        let written = (|| {
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&tmp)?;
            f.write_all(sandbox_id.as_bytes())?;
            f.write_all(b"\n")?;
            f.write_all(&answer.encode_to_vec())?;
            std::fs::rename(&tmp, &path)
        })();
        if written.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        self.sweep_now_and_then();
        written
    }

    /// Remove records older than [`KEEP`], at most every [`SWEEP_EVERY`].
    fn sweep_now_and_then(&self) {
        {
            let mut last = self
                .last_sweep
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if last.is_some_and(|t| t.elapsed() < SWEEP_EVERY) {
                return;
            }
            *last = Some(Instant::now());
        }
        self.sweep(SystemTime::now());
    }

    /// Remove the records older than [`KEEP`] at `now`.
    pub fn sweep(&self, now: SystemTime) {
        for e in std::fs::read_dir(&self.dir).into_iter().flatten().flatten() {
            let old = e
                .metadata()
                .and_then(|m| m.modified())
                .is_ok_and(|t| now.duration_since(t).is_ok_and(|age| age > KEEP));
            if old {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
}

fn split(raw: &[u8]) -> Option<(&[u8], &[u8])> {
    let nl = raw.iter().position(|&b| b == b'\n')?;
    Some((&raw[..nl], &raw[nl + 1..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_comes_back_for_its_key_and_sandbox_only_and_goes_after_a_day() {
        let tmp = tempfile::tempdir().unwrap();
        let records = PatchRecords::open(&tmp.path().join("r")).unwrap();
        let answer = CollectPatchResponse {
            patch: "+fork 1\n".into(),
            patch_bytes: 8,
            ..Default::default()
        };
        assert_eq!(records.get("run/fork-1/a1/patch", "sbx-1"), Ok(None));
        records
            .put("run/fork-1/a1/patch", "sbx-1", &answer)
            .unwrap();
        assert_eq!(
            records.get("run/fork-1/a1/patch", "sbx-1"),
            Ok(Some(answer))
        );
        assert!(records.get("run/fork-1/a1/patch", "sbx-2").is_err());
        assert_eq!(records.get("run/fork-2/a1/patch", "sbx-1"), Ok(None));
        records.sweep(SystemTime::now() + KEEP + Duration::from_secs(1));
        assert_eq!(records.get("run/fork-1/a1/patch", "sbx-1"), Ok(None));
    }
}
