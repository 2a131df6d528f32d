//! File helpers every floor uses: a tree removed whatever a sandbox left in it (a
//! directory without write or search permission, a symlink swapped in mid-walk), and a
//! file overwritten in place, an executable found.

use crate::local::base::fd_walk;
use std::path::{Path, PathBuf};

/// Overwrite the existing file `path` with `content` without truncating it to nothing
/// first (`NotFound` when there is none): ext4 writes a file truncated to zero out to
/// the disk when it is closed (`auto_da_alloc`), a device round trip in every create.
/// Cut to the new length once written instead.
pub(crate) fn write_in_place(path: &Path, content: &[u8]) -> std::io::Result<()> {
    let mut file = std::fs::OpenOptions::new().write(true).open(path)?;
    std::io::Write::write_all(&mut file, content)?;
    file.set_len(content.len() as u64)
}

/// Remove `path` recursively; missing is fine. A sandbox may leave directories without
/// write or search permission, so on failure make everything writable and retry.
pub fn remove_all(path: &Path) -> std::io::Result<()> {
    match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
        Ok(m) if !m.is_dir() => return std::fs::remove_file(path),
        Ok(_) => {}
    }
    if std::fs::remove_dir_all(path).is_ok() {
        return Ok(());
    }
    make_writable(path);
    match std::fs::remove_dir_all(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// Every directory under `dir` owner-writable and searchable, by descriptor: a sandbox
/// process still alive can swap a directory for a symlink mid-walk, and a path-based
/// `chmod` would follow it to whatever it names (as root: anything on the host, or a git
/// object file shared with other sandboxes). Best effort: the removal's retry says what
/// is left.
fn make_writable(dir: &Path) {
    let walked = fd_walk::walk(dir, |entry| {
        if !entry.is_dir() {
            return Ok(false);
        }
        let _ = entry.chmod(0o700);
        Ok(true)
    });
    if let Err(e) = walked {
        tracing::debug!(dir = %dir.display(), error = %e, "cannot make every directory writable");
    }
}

/// `path` if it names an executable, else the first match on `$PATH`.
pub fn find_executable(path: &Path) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let executable = |p: &Path| {
        p.metadata()
            .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if path.components().count() > 1 {
        return executable(path).then(|| path.to_path_buf());
    }
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join(path))
        .find(|p| executable(p))
}

#[cfg(test)]
#[path = "fs_tests.rs"]
mod tests;
