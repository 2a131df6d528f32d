//! Reading a local git repository's refs from its files, without starting git: the
//! gateway's check that a repository answers, and the provisioner's choice of a
//! workspace template. Each answers `None` where only git could tell (a URL, a ref
//! format it does not read), and the caller asks git then.

use std::path::{Path, PathBuf};

pub fn is_sha(s: &str) -> bool {
    s.len() == 40 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The git directory of a local repository (`<repo>/.git`, or `<repo>` when bare).
pub fn git_dir(repo: &str) -> Option<PathBuf> {
    if repo.contains("://") || repo.contains(':') || repo.starts_with("git@") {
        return None;
    }
    let repo = Path::new(repo);
    let dot = repo.join(".git");
    if std::fs::symlink_metadata(&dot).is_ok_and(|m| m.is_dir()) {
        return dot.join("objects").is_dir().then_some(dot);
    }
    (repo.join("HEAD").is_file() && repo.join("objects").is_dir()).then(|| repo.to_path_buf())
}

/// The text of `path` if it is a regular file (not a symlink, a pipe or a device: those
/// are git's to read, or nobody's); `Err(true)` when there is nothing at `path`.
fn read_plain(path: &Path) -> Result<String, bool> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_file() => std::fs::read_to_string(path).map_err(|_| false),
        Ok(_) => Err(false),
        Err(e) => Err(e.kind() == std::io::ErrorKind::NotFound),
    }
}

/// `full` (e.g. `refs/heads/main`) in `dir`: a loose ref file, else `packed-refs`.
pub fn read_ref(dir: &Path, full: &str, depth: u8) -> Option<String> {
    if depth > 4 || full.contains("..") || full.starts_with('/') || full.contains("//") {
        return None;
    }
    match read_plain(&dir.join(full)) {
        Ok(text) => {
            let text = text.trim();
            return match text.strip_prefix("ref: ") {
                Some(target) => read_ref(dir, target.trim(), depth + 1),
                None => is_sha(text).then(|| text.to_ascii_lowercase()),
            };
        }
        // Something other than a plain file, or unreadable: only git can tell.
        Err(false) => return None,
        Err(true) => {}
    }
    let packed = read_plain(&dir.join("packed-refs")).ok()?;
    packed.lines().find_map(|l| {
        let (sha, name) = l.split_once(' ')?;
        (name == full && is_sha(sha)).then(|| sha.to_ascii_lowercase())
    })
}

/// The commit `base_ref` names in local repository `repo`, read from its ref files;
/// `None` when that cannot be told without git (then the caller clones as before).
pub fn local_commit(repo: &str, base_ref: &str) -> Option<String> {
    let dir = git_dir(repo)?;
    match base_ref {
        "" | "HEAD" => read_ref(&dir, "HEAD", 0),
        s if is_sha(s) => Some(s.to_ascii_lowercase()),
        name => {
            // A branch, unless a tag of that name could be meant (tags need peeling).
            let tag = format!("refs/tags/{name}");
            if read_ref(&dir, &tag, 0).is_some() || dir.join(&tag).exists() {
                return None;
            }
            read_ref(&dir, &format!("refs/heads/{name}"), 0)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_ref_files_of_a_real_git_dir_are_read() {
        let tmp = tempfile::tempdir().unwrap();
        let repo = tmp.path().join("r");
        let git = repo.join(".git");
        std::fs::create_dir_all(git.join("refs/heads")).unwrap();
        let sha = "0123456789abcdef0123456789abcdef01234567";
        std::fs::write(git.join("HEAD"), "ref: refs/heads/main\n").unwrap();
        std::fs::write(git.join("refs/heads/main"), format!("{sha}\n")).unwrap();
        let path = repo.to_str().unwrap();
        assert_eq!(
            local_commit(path, "HEAD"),
            None,
            "no objects/: not a repository"
        );
        std::fs::create_dir(git.join("objects")).unwrap();
        assert_eq!(local_commit(path, "HEAD").as_deref(), Some(sha));
        // A ref that is a symlink (to any file of the host) is git's to judge.
        std::fs::remove_file(git.join("refs/heads/main")).unwrap();
        let outside = tmp.path().join("outside");
        std::fs::write(&outside, format!("{sha}\n")).unwrap();
        std::os::unix::fs::symlink(&outside, git.join("refs/heads/main")).unwrap();
        assert_eq!(local_commit(path, "HEAD"), None);
        // So is a named pipe, which would block the reader.
        std::fs::remove_file(git.join("refs/heads/main")).unwrap();
        let fifo = std::process::Command::new("mkfifo")
            .arg(git.join("refs/heads/main"))
            .status()
            .unwrap();
        assert!(fifo.success());
        assert_eq!(local_commit(path, "HEAD"), None);
    }
}
