//! Patch collection: a sandbox's changes against its base commit.

use crate::{
    error::{ProvisionerError, Result},
    git,
    limits::{DEFAULT_PATCH_BYTES, MAX_PATCH_BYTES},
    local::{
        core::{prepare::Tools, provisioner::Provisioner},
        isolation::command::process::{Caps, Captured, Finished, Outcome},
        storage::repo::patch_scan,
    },
};
use forkyard_proto::sandbox::v1::{CollectPatchRequest, CollectPatchResponse};

impl Provisioner {
    /// The workspace's changes against the base commit, computed by git inside the
    /// sandbox (the agent controls the repository: its hooks and config never run here).
    /// Under the sandbox's init, the provisioner reads what the patch leaves out on the
    /// host ([`patch_scan`]) and the init runs `git add` and `git diff` as two commands;
    /// otherwise (a bubblewrap per command, or a workspace of unusual shape) one sandbox
    /// process runs [`PATCH_SCRIPT`]. Process starts cost more than the git work here,
    /// and this runs once per fork.
    #[tracing::instrument(name = "git.patch", skip_all, fields(sandbox_id = %req.sandbox_id, patch_bytes = tracing::field::Empty, unchanged = tracing::field::Empty))]
    pub async fn collect_patch(&self, req: CollectPatchRequest) -> Result<CollectPatchResponse> {
        let id = &req.sandbox_id;
        let record = self.entry(id)?.record();
        let base = record.base_commit.clone();
        let max = match req.max_bytes {
            0 => DEFAULT_PATCH_BYTES,
            n => n.min(MAX_PATCH_BYTES),
        };
        let max = usize::try_from(max).unwrap_or(usize::MAX);
        let caps = Caps {
            stdout: max.saturating_add(NUMSTAT_BYTES),
            stderr: 64 * 1024,
            tail: false,
        };
        let scan = if self.runs_under_init(&record, Tools::Provisioner) {
            let ws = self.storage.store.workspace(id);
            let made = record.made_index.clone();
            let _turn = SCANS.acquire().await;
            tokio::task::spawn_blocking(move || {
                patch_scan::scan(
                    &ws,
                    SKIP_FILE_BYTES,
                    Some(made.as_str()).filter(|m| !m.is_empty()),
                )
            })
            .await
            .ok()
            .flatten()
        } else {
            None
        };
        let (out, skipped_files) = match scan {
            Some(scan) => (
                self.patch_in_steps(id, &base, &scan, caps).await?,
                scan.skipped(),
            ),
            None => {
                let out = self.patch_by_script(id, &base, caps).await?;
                let skipped = skipped(&out.stderr.lossy());
                (out, skipped)
            }
        };
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
            skipped_files,
        })
    }

    /// `git add` (every file but those the scan left out), then `git diff` of the index
    /// against the base: two commands of the sandbox's init, no shell. When every file
    /// of the worktree is tracked and none is too large, staging would change nothing
    /// `git diff` of the worktree does not see: that one command is the patch (the
    /// common case of an agent that edits files; each git process is a millisecond or
    /// two of CPU here). When the workspace is still as it was made (an agent that
    /// changed nothing: it gave up, failed, or found nothing to do), there is no patch
    /// and no git to run.
    async fn patch_in_steps(
        &self,
        id: &str,
        base: &str,
        scan: &patch_scan::Scan,
        caps: Caps,
    ) -> Result<Finished> {
        if scan.unchanged {
            // git would look at no file's content and print nothing.
            tracing::Span::current().record("unchanged", true);
            return Ok(Finished {
                outcome: Outcome::Exited { code: 0 },
                stdout: Captured::default(),
                stderr: Captured::default(),
                duration: std::time::Duration::ZERO,
            });
        }
        let env = git::sandbox_env();
        let timeout = self.config.exec_timeout;
        if scan.only_tracked && scan.too_large.is_empty() {
            let worktree = diff_of(base, &[]);
            let out = self
                .run_in(id, &worktree, &env, None, timeout, caps)
                .await?;
            checked_step("git diff", &out)?;
            return Ok(out);
        }
        let mut add = vec!["git".to_owned(), "add".into(), "-A".into()];
        let input = if scan.too_large.is_empty() {
            None
        } else {
            add.extend([
                "--pathspec-from-file=-".into(),
                "--pathspec-file-nul".into(),
            ]);
            Some(
                memfd_with(&scan.pathspecs())
                    .map_err(|e| ProvisionerError::internal("pathspecs for git add", e))?,
            )
        };
        let small = Caps {
            stdout: 64 * 1024,
            ..caps
        };
        let added = self.run_in(id, &add, &env, input, timeout, small).await?;
        checked_step("git add", &added)?;
        let out = self
            .run_in(id, &diff_of(base, &["--cached"]), &env, None, timeout, caps)
            .await?;
        checked_step("git diff", &out)?;
        Ok(out)
    }

    /// [`PATCH_SCRIPT`] in one sandbox process.
    async fn patch_by_script(&self, id: &str, base: &str, caps: Caps) -> Result<Finished> {
        let skip_over = SKIP_FILE_BYTES.to_string();
        let argv: Vec<String> = ["sh", "-c", PATCH_SCRIPT, "forkyard-patch", &skip_over]
            .iter()
            .chain(&["--cached"])
            .chain(DIFF_OPTIONS)
            .chain(&[base, "--"])
            .map(|s| (*s).to_owned())
            .collect();
        let out = self
            .run_in(
                id,
                &argv,
                &git::sandbox_env(),
                None,
                self.config.exec_timeout,
                caps,
            )
            .await?;
        match out.outcome {
            Outcome::Exited { code } if code != 0 => {
                let what = if code == 101 { "git add" } else { "git diff" };
                checked_step(what, &out)?;
            }
            _ => checked_step("the patch script", &out)?,
        }
        Ok(out)
    }
}

/// Scans at once: each may hold a workspace's git index (the agent's file, up to 16 MiB)
/// in the provisioner's memory.
static SCANS: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(4);

/// The options of every patch's diff (after `--numstat --patch --binary` and, for a
/// diff of the index, `--cached`): plain, with no program of the repository's
/// configuration run.
const DIFF_OPTIONS: &[&str] = &["--no-color", "--no-ext-diff", "--no-textconv"];

/// A step that did not exit 0 is the collection's error, saying which step and why.
fn checked_step(what: &str, out: &Finished) -> Result<()> {
    match out.outcome {
        Outcome::Exited { code: 0 } => Ok(()),
        Outcome::Exited { .. } => Err(ProvisionerError::FailedPrecondition(format!(
            "{what} in the sandbox failed: {}",
            out.stderr.lossy().trim()
        ))),
        _ => Err(ProvisionerError::Internal(
            "collecting the patch in the sandbox timed out".into(),
        )),
    }
}

/// An anonymous in-memory file holding `bytes`, read from its start: a command's stdin.
fn memfd_with(bytes: &[u8]) -> std::io::Result<std::os::fd::OwnedFd> {
    use std::io::{Seek, Write};
    let fd = rustix::fs::memfd_create("forkyard-input", rustix::fs::MemfdFlags::CLOEXEC)?;
    let mut file = std::fs::File::from(fd);
    file.write_all(bytes)?;
    file.rewind()?;
    Ok(file.into())
}

/// The patch in one sandbox process, where the init does not run it in steps. Stage
/// everything, then one `git diff --numstat -p --binary` of the index against the
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

/// `git diff` of the patch against `base`: of the index (`what` is `--cached`), or of
/// the worktree.
fn diff_of(base: &str, what: &[&str]) -> Vec<String> {
    ["git", "diff", "--numstat", "--patch", "--binary"]
        .iter()
        .chain(what)
        .chain(DIFF_OPTIONS)
        .chain(&[base, "--"])
        .map(|s| (*s).to_owned())
        .collect()
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
