//! Patch collection: a sandbox's changes against its base commit.

use crate::{
    error::{ProvisionerError, Result},
    git,
    limits::{DEFAULT_PATCH_BYTES, MAX_PATCH_BYTES},
    local::{
        process::{Caps, Outcome},
        provisioner::Provisioner,
    },
};
use forkyard_proto::sandbox::v1::{CollectPatchRequest, CollectPatchResponse};

impl Provisioner {
    /// The workspace's changes against the base commit, computed by git inside the
    /// sandbox (the agent controls the repository: its hooks and config never run here).
    /// One sandbox process does all of it ([`PATCH_SCRIPT`]): starting a sandbox, or any
    /// process, costs more than the git work, and this runs once per fork.
    #[tracing::instrument(name = "git.patch", skip_all, fields(sandbox_id = %req.sandbox_id, patch_bytes = tracing::field::Empty))]
    pub async fn collect_patch(&self, req: CollectPatchRequest) -> Result<CollectPatchResponse> {
        let id = &req.sandbox_id;
        let base = self.entry(id)?.record().base_commit;
        let max = match req.max_bytes {
            0 => DEFAULT_PATCH_BYTES,
            n => n.min(MAX_PATCH_BYTES),
        };
        let argv: Vec<String> = [
            "sh",
            "-c",
            PATCH_SCRIPT,
            "forkyard-patch",
            &SKIP_FILE_BYTES.to_string(),
            "--cached",
            "--no-color",
            "--no-ext-diff",
            "--no-textconv",
            &base,
            "--",
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
        let max = usize::try_from(max).unwrap_or(usize::MAX);
        let caps = Caps {
            stdout: max.saturating_add(NUMSTAT_BYTES),
            stderr: 64 * 1024,
            tail: false,
        };
        let out = self
            .run_in(
                id,
                &argv,
                &git::sandbox_env(),
                self.config.exec_timeout,
                caps,
            )
            .await?;
        match out.outcome {
            Outcome::Exited { code: 0 } => {}
            Outcome::Exited { code } => {
                let what = if code == 101 { "git add" } else { "git diff" };
                return Err(ProvisionerError::FailedPrecondition(format!(
                    "{what} in the sandbox failed: {}",
                    out.stderr.lossy().trim()
                )));
            }
            _ => {
                return Err(ProvisionerError::Internal(
                    "collecting the patch in the sandbox timed out".into(),
                ));
            }
        }
        let (numstat, patch, patch_bytes) = split_numstat(&out.stdout.bytes, out.stdout.total);
        let kept = &patch[..patch.len().min(max)];
        tracing::Span::current().record("patch_bytes", patch_bytes);
        Ok(CollectPatchResponse {
            truncated: patch_bytes > kept.len() as u64,
            patch_bytes,
            patch: String::from_utf8_lossy(kept).into_owned(),
            diffstat: Some(git::parse_numstat(&String::from_utf8_lossy(numstat))),
            base_commit: base,
            usage: Some(self.usage(&*self.entry(id)?)),
            skipped_files: skipped(&out.stderr.lossy()),
        })
    }
}

/// Stage everything, then one `git diff --numstat -p --binary` of the index against the
/// base (`"$@"`: diff options, the base commit, `--`): its numstat lines, a blank line,
/// then the patch (nothing at all when nothing changed). A failed step exits non-zero
/// with git's message on stderr (101: the add). An index lock left by an add cut off
/// mid-way (an earlier collection whose caller died) is removed once it is a few seconds
/// old, so the retry does not fail on `index.lock: File exists`.
///
/// `$1` is a size in bytes: larger files are neither staged nor hashed (an agent that
/// wrote 12 GB past its disk limit cost the fork a minute of `git add`); they are named
/// on stderr, one `forkyard-skipped <path>` line each.
///
/// The workspace's own `.git` directory (the usual case) is found without asking git:
/// each process costs about a millisecond of CPU here, and this runs once per fork;
/// anything else (a `.git` file or link the agent made) asks git where its directory is.
const PATCH_SCRIPT: &str = r#"if [ -d .git ] && [ ! -L .git ]; then gitdir=.git; else gitdir=$(git rev-parse --absolute-git-dir) || exit 101; fi
lock=$gitdir/index.lock
if [ -e "$lock" ] && [ $(( $(date +%s) - $(stat -c %Y "$lock") )) -ge 5 ]; then rm -f "$lock"; fi
skip=$gitdir/forkyard-skip
find . -path ./.git -prune -o -type f -size +"$1"c -printf '%P\0' > "$skip" || exit 101
shift
if [ -s "$skip" ]; then
  { printf '.\0'; sed -z 's/^/:(exclude,literal)/' "$skip"; } | git add -A --pathspec-from-file=- --pathspec-file-nul || exit 101
  sed -z 's/^/forkyard-skipped /' "$skip" | tr '\0' '\n' >&2
else
  git add -A || exit 101
fi
exec git diff --numstat --patch --binary "$@""#;

/// Files larger than this stay out of the patch: no patch may be larger.
const SKIP_FILE_BYTES: u64 = MAX_PATCH_BYTES;

/// The paths the script named as left out (its `forkyard-skipped` lines).
fn skipped(stderr: &str) -> Vec<String> {
    stderr
        .lines()
        .filter_map(|l| l.strip_prefix("forkyard-skipped "))
        .map(str::to_owned)
        .collect()
}

/// Room for the numstat lines ahead of the patch: a line per changed file.
const NUMSTAT_BYTES: usize = 16 * 1024 * 1024;

/// The numstat block, the captured patch and the patch's full length, from `git diff
/// --numstat --patch` output of which `captured` is the start and `total` the length.
/// Output cut inside the numstat block (more than [`NUMSTAT_BYTES`] of it) keeps the
/// lines read and counts everything as the patch's.
fn split_numstat(captured: &[u8], total: u64) -> (&[u8], &[u8], u64) {
    if captured.is_empty() {
        return (&[], &[], 0);
    }
    match captured.windows(2).position(|w| w == b"\n\n") {
        Some(i) => {
            let head = (i + 2) as u64;
            (&captured[..=i], &captured[i + 2..], total - head)
        }
        None => (captured, &[], total.saturating_sub(captured.len() as u64)),
    }
}

#[cfg(test)]
mod tests {
    use super::split_numstat;

    #[test]
    fn numstat_and_patch_are_told_apart_also_when_the_patch_was_cut() {
        let out = b"1\t0\ta.txt\n-\t-\tb.bin\n\ndiff --git a/a.txt b/a.txt\n\n+x\n";
        let (n, p, len) = split_numstat(out, out.len() as u64);
        assert_eq!(n, b"1\t0\ta.txt\n-\t-\tb.bin\n");
        assert_eq!(p, b"diff --git a/a.txt b/a.txt\n\n+x\n");
        assert_eq!(len, p.len() as u64);
        // Only the first 40 bytes were kept of 1,000.
        let (n, p, len) = split_numstat(&out[..40], 1000);
        assert_eq!(n, b"1\t0\ta.txt\n-\t-\tb.bin\n");
        assert_eq!(p, b"diff --git a/a.txt ");
        assert_eq!(len, 1000 - 21);
        assert_eq!(split_numstat(b"", 0), (&b""[..], &b""[..], 0));
    }
}
