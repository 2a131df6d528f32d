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
        return Some(dot);
    }
    (repo.join("HEAD").is_file() && repo.join("objects").is_dir()).then(|| repo.to_path_buf())
}

/// `full` (e.g. `refs/heads/main`) in `dir`: a loose ref file, else `packed-refs`.
pub fn read_ref(dir: &Path, full: &str, depth: u8) -> Option<String> {
    if depth > 4 || full.contains("..") || full.starts_with('/') || full.contains("//") {
        return None;
    }
    if let Ok(text) = std::fs::read_to_string(dir.join(full)) {
        let text = text.trim();
        return match text.strip_prefix("ref: ") {
            Some(target) => read_ref(dir, target.trim(), depth + 1),
            None => is_sha(text).then(|| text.to_ascii_lowercase()),
        };
    }
    let packed = std::fs::read_to_string(dir.join("packed-refs")).ok()?;
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
