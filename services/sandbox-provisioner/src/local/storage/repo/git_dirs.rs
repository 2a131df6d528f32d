//! The directories git reads when it clones a local repository: the repository's own
//! git directory (`.git`, a bare repository itself, or wherever a `.git` *file*'s
//! `gitdir:` line points), a worktree's common directory (`commondir`), and the object
//! directories its `objects/info/alternates` name, followed as git follows them.
//!
//! A path outside the provisioner's state directory can still lead git into it: a
//! `.git` file naming another sandbox's `.git`, or alternates naming a template's
//! objects. Git's ownership check (`safe.directory`) is the only other guard, and it
//! passes wherever sandboxes share the provisioner's uid (the container images). So
//! every directory git would read is checked, not just the path named.

use std::path::{Path, PathBuf};

/// Git follows alternates of alternates; a chain this long is no repository's.
const MAX_ALTERNATES: usize = 16;

/// The git directories a clone of the local repository `repo` (canonical) reads, each
/// canonical where it exists.
pub fn read_by_clone(repo: &Path) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    let git_dir = match std::fs::symlink_metadata(repo.join(".git")) {
        Ok(m) if m.is_file() => gitdir_file(repo),
        Ok(_) => Some(repo.join(".git")),
        // A bare repository is its own git directory.
        Err(_) => Some(repo.to_path_buf()),
    };
    let Some(git_dir) = git_dir.map(|d| canonical(&d)) else {
        return dirs;
    };
    dirs.push(git_dir.clone());
    if let Some(common) = read_line(&git_dir.join("commondir")) {
        dirs.push(canonical(&git_dir.join(common)));
    }
    let mut objects: Vec<PathBuf> = dirs.iter().map(|d| d.join("objects")).collect();
    let mut seen = 0;
    while let Some(dir) = objects.pop() {
        seen += 1;
        if seen > MAX_ALTERNATES * 2 {
            break;
        }
        let Ok(list) = std::fs::read_to_string(dir.join("info/alternates")) else {
            continue;
        };
        for line in list.lines().map(str::trim) {
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let alt = canonical(&dir.join(line));
            dirs.push(alt.clone());
            objects.push(alt);
        }
    }
    dirs
}

/// The directory a `.git` file's `gitdir:` line names (relative to the repository).
fn gitdir_file(repo: &Path) -> Option<PathBuf> {
    let line = read_line(&repo.join(".git"))?;
    let target = line.strip_prefix("gitdir:")?.trim();
    Some(repo.join(target))
}

fn read_line(path: &Path) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    Some(text.lines().next()?.trim().to_owned())
}

fn canonical(path: &Path) -> PathBuf {
    std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    fn git(dir: &Path, args: &[&str]) {
        let ok = Command::new("git")
            .arg("-C")
            .arg(dir)
            .args(args)
            .output()
            .unwrap();
        assert!(
            ok.status.success(),
            "{}",
            String::from_utf8_lossy(&ok.stderr)
        );
    }

    #[test]
    fn gitdir_files_worktrees_and_alternates_are_followed() {
        let tmp = tempfile::tempdir().unwrap();
        let t = std::fs::canonicalize(tmp.path()).unwrap();
        let victim = t.join("victim");
        std::fs::create_dir(&victim).unwrap();
        git(&victim, &["init", "-q"]);
        git(&victim, &["commit", "-q", "--allow-empty", "-m", "x"]);

        let plain = t.join("plain");
        std::fs::create_dir(&plain).unwrap();
        git(&plain, &["init", "-q"]);
        assert_eq!(read_by_clone(&plain), [plain.join(".git")]);

        let pointer = t.join("pointer");
        std::fs::create_dir(&pointer).unwrap();
        std::fs::write(
            pointer.join(".git"),
            format!("gitdir: {}/.git\n", victim.display()),
        )
        .unwrap();
        assert_eq!(read_by_clone(&pointer), [victim.join(".git")]);

        let wt = t.join("wt");
        git(&victim, &["worktree", "add", "-q", wt.to_str().unwrap()]);
        assert!(read_by_clone(&wt).contains(&victim.join(".git")));

        let bare = t.join("bare.git");
        git(&t, &["init", "-q", "--bare", bare.to_str().unwrap()]);
        std::fs::write(
            bare.join("objects/info/alternates"),
            format!("{}/.git/objects\n", victim.display()),
        )
        .unwrap();
        assert!(read_by_clone(&bare).contains(&victim.join(".git/objects")));
    }
}
