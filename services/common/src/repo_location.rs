//! Where a run's repository lives: somewhere git reaches over a network, or a path on
//! this host (given plainly or as a `file://` URL). Both forms of a local path must get
//! the same checks: git reads `file:///x` and `/x` alike, so a check that looked only at
//! plain paths let `file://<a live sandbox's workspace>` through.

use std::path::{Path, PathBuf};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RepoLocation {
    /// `https://…`, `ssh://…`, `git://…`, or scp-like `user@host:path`.
    Remote,
    /// A path on this host: a plain path, or the path of a `file://` URL (decoded, not
    /// yet resolved: see [`canonical_local`]).
    Local(PathBuf),
}

/// Classify `repo`; `Err` says why it cannot be used at all.
pub fn locate(repo: &str) -> Result<RepoLocation, String> {
    if repo.starts_with('-') {
        return Err("must not start with '-'".into());
    }
    if let Some((scheme, _)) = repo.split_once("://") {
        if scheme.eq_ignore_ascii_case("file") {
            let url = url::Url::parse(repo).map_err(|e| format!("is not a valid file URL: {e}"))?;
            if url
                .host_str()
                .is_some_and(|h| !h.is_empty() && h != "localhost")
            {
                return Err("a file:// URL must name no host (or localhost)".into());
            }
            let path = url
                .to_file_path()
                .map_err(|()| "is not a valid file URL".to_owned())?;
            return Ok(RepoLocation::Local(path));
        }
        return Ok(RepoLocation::Remote);
    }
    // git's own rule: a colon before the first slash makes `host:path` (scp-like ssh).
    let colon = repo.find(':');
    let slash = repo.find('/');
    if colon.is_some_and(|c| slash.is_none_or(|s| c < s)) {
        return Ok(RepoLocation::Remote);
    }
    Ok(RepoLocation::Local(PathBuf::from(repo)))
}

/// The path with every symlink and `..` resolved; `Err` when it does not exist.
pub fn canonical_local(path: &Path) -> std::io::Result<PathBuf> {
    std::fs::canonicalize(path)
}

/// The directories under a provisioner's state directory that hold sandboxes' work (live
/// workspaces, templates, destroyed ones, snapshots): never a run's repository.
pub fn sandbox_data_dirs(state_dir: &Path) -> Vec<PathBuf> {
    ["sandboxes", "templates", "trash", "snapshots"]
        .iter()
        .map(|d| state_dir.join(d))
        .collect()
}

/// Whether `path` (canonical) is `root` or under it; `root` is resolved first when it
/// exists, so a state directory reached through a symlink is still recognised.
pub fn is_within(path: &Path, root: &Path) -> bool {
    let root = std::fs::canonicalize(root).unwrap_or_else(|_| root.to_path_buf());
    path.starts_with(root)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_paths_and_scp_forms() {
        assert_eq!(
            locate("https://github.com/a/b.git"),
            Ok(RepoLocation::Remote)
        );
        assert_eq!(locate("ssh://git@h/a.git"), Ok(RepoLocation::Remote));
        assert_eq!(locate("git@github.com:a/b.git"), Ok(RepoLocation::Remote));
        assert_eq!(locate("host:repo"), Ok(RepoLocation::Remote));
        assert_eq!(
            locate("/srv/repo"),
            Ok(RepoLocation::Local("/srv/repo".into()))
        );
        assert_eq!(locate("./a:b"), Ok(RepoLocation::Local("./a:b".into())));
        assert!(locate("--upload-pack=x").is_err());
    }

    #[test]
    fn file_urls_are_local_paths_decoded() {
        assert_eq!(
            locate("file:///srv/my%20repo"),
            Ok(RepoLocation::Local("/srv/my repo".into()))
        );
        assert_eq!(
            locate("FILE://localhost/srv/r"),
            Ok(RepoLocation::Local("/srv/r".into()))
        );
        assert!(locate("file://otherhost/srv/r").is_err());
    }

    #[test]
    fn within_resolves_the_root() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("state");
        std::fs::create_dir(&real).unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        std::fs::create_dir(real.join("ws")).unwrap();
        let ws = canonical_local(&link.join("ws")).unwrap();
        assert!(is_within(&ws, &link));
        assert!(!is_within(&ws, &dir.path().join("other")));
    }
}
