//! Where a run's repository lives: somewhere git reaches over a network, or a path on
//! this host (given plainly or as a `file://` URL). Both forms of a local path must get
//! the same checks: git reads `file:///x` and `/x` alike, so a check that looked only at
//! plain paths let `file://<a live sandbox's workspace>` through.
//!
//! Only git's network transports that reach a host by name (https, http, ssh in both its
//! forms, git) and local paths are taken: git's `<helper>::<address>` forms run other
//! programs (`ext::` a command, `fd::` reads descriptors of the process that runs git and
//! hangs until its timeout), and other URL schemes start remote helpers.

use crate::allowed_hosts::{normal_host, valid_host};
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RepoLocation {
    /// `https://…`, `http://…`, `ssh://…`, `git://…`, or scp-like `user@host:path`.
    Remote(Remote),
    /// A path on this host: a plain path, or the path of a `file://` URL (decoded, not
    /// yet resolved: see [`canonical_local`]).
    Local(PathBuf),
}

/// The host a remote repository is read from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Remote {
    pub transport: Transport,
    /// Normalised (`crate::allowed_hosts::normal_host`).
    pub host: String,
    pub port: u16,
    /// The repository's path on the host as its forge names it (`org/x` for
    /// `https://github.com/org/x.git` and `git@github.com:org/x.git`; [`repo_path`]).
    pub path: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    Https,
    Http,
    Ssh,
    Git,
}

impl Transport {
    fn from_scheme(scheme: &str) -> Option<Self> {
        match scheme {
            "https" => Some(Self::Https),
            "http" => Some(Self::Http),
            "ssh" | "git+ssh" | "ssh+git" => Some(Self::Ssh),
            "git" => Some(Self::Git),
            _ => None,
        }
    }

    fn default_port(self) -> u16 {
        match self {
            Self::Https => 443,
            Self::Http => 80,
            Self::Ssh => 22,
            Self::Git => 9418,
        }
    }
}

const TRANSPORTS: &str =
    "https://, http://, ssh://, git://, user@host:path, file:// or a local path";

/// Classify `repo`; `Err` says why it cannot be used at all.
pub fn locate(repo: &str) -> Result<RepoLocation, String> {
    if repo.starts_with('-') {
        return Err("must not start with '-'".into());
    }
    if let Some(helper) = remote_helper(repo) {
        return Err(format!(
            "git's {helper}:: transport is not allowed (only {TRANSPORTS})"
        ));
    }
    if let Some((scheme, _)) = repo.split_once("://") {
        let scheme = scheme.to_ascii_lowercase();
        if scheme == "file" {
            return file_url(repo);
        }
        let Some(transport) = Transport::from_scheme(&scheme) else {
            return Err(format!(
                "{scheme}:// is not an allowed transport (only {TRANSPORTS})"
            ));
        };
        let url = url::Url::parse(repo).map_err(|e| format!("is not a valid URL: {e}"))?;
        let host = url.host_str().unwrap_or_default();
        return remote(transport, host, url.port(), repo);
    }
    // git's own rule: a colon before the first slash makes `host:path` (scp-like ssh).
    let colon = repo.find(':');
    let slash = repo.find('/');
    if colon.is_some_and(|c| slash.is_none_or(|s| c < s)) {
        return scp_like(repo);
    }
    Ok(RepoLocation::Local(PathBuf::from(repo)))
}

fn file_url(repo: &str) -> Result<RepoLocation, String> {
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
    Ok(RepoLocation::Local(path))
}

/// `[user@]host:path` or `[user@][v6]:path`.
fn scp_like(repo: &str) -> Result<RepoLocation, String> {
    let (user_host, _) = match repo.find("]:") {
        Some(end) if repo.contains('[') => repo.split_at(end + 1),
        _ => repo.split_at(repo.find(':').unwrap_or(repo.len())),
    };
    let host = user_host.rsplit_once('@').map_or(user_host, |(_, h)| h);
    remote(Transport::Ssh, host, None, repo)
}

fn remote(
    transport: Transport,
    host: &str,
    port: Option<u16>,
    repo: &str,
) -> Result<RepoLocation, String> {
    let host = normal_host(host);
    if host.starts_with('-') || !valid_host(&host) {
        return Err(format!("{host:?} is not a host name or address"));
    }
    Ok(RepoLocation::Remote(Remote {
        transport,
        host,
        port: port.unwrap_or(transport.default_port()),
        path: repo_path(repo),
    }))
}

/// A repository URL's path on its host, as a forge names the repository:
/// `https://github.com/org/x.git` and `git@github.com:org/x.git` are `org/x`. `None` for
/// a local path or a URL without one (or with a single segment: no forge's).
pub fn repo_path(repo: &str) -> Option<String> {
    let path = match url::Url::parse(repo) {
        Ok(url) if url.has_host() => url.path().to_owned(),
        // scp-like `user@host:path` (no scheme: url takes `user@host` for one).
        _ => {
            let (authority, path) = match repo.find("]:") {
                Some(end) if repo.starts_with('[') || repo.contains("@[") => {
                    (&repo[..=end], &repo[end + 2..])
                }
                _ => repo.split_once(':')?,
            };
            if authority.contains('/') || path.starts_with("//") {
                return None;
            }
            path.to_owned()
        }
    };
    let path = path.trim_matches('/');
    let path = path
        .strip_suffix(".git")
        .unwrap_or(path)
        .trim_end_matches('/');
    (path.contains('/') && !path.split('/').any(str::is_empty)).then(|| path.to_owned())
}

/// The helper of git's `<transport>::<address>` form (`ext`, `fd`, any remote helper):
/// a scheme's characters up to `::`, as git's transport_get reads it.
fn remote_helper(repo: &str) -> Option<&str> {
    let end = repo.find("::")?;
    let helper = &repo[..end];
    let mut chars = helper.chars();
    let first = chars.next()?;
    (first.is_ascii_alphabetic()
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.')))
    .then_some(helper)
}

/// Whether `repo` carries credentials: a password in any URL, or a user name in an
/// `http(s)://` one (where it is a token's place; an `ssh://git@` or `git@host:` user is
/// the SSH login, no secret).
pub fn carries_credentials(repo: &str) -> bool {
    let Ok(url) = url::Url::parse(repo) else {
        return false;
    };
    url.password().is_some()
        || (matches!(url.scheme(), "http" | "https") && !url.username().is_empty())
}

/// A repository URL as it may be shown (in messages and logs): without the user name
/// and password a URL may carry (a token often is one of them).
pub fn shown(repo: &str) -> String {
    match url::Url::parse(repo) {
        Ok(mut url) if repo.contains("://") && url.has_host() => {
            let _ = url.set_username("");
            let _ = url.set_password(None);
            url.to_string()
        }
        _ => repo.to_owned(),
    }
}

/// Proxy variables git and HTTP clients read: removed where a connection must go to the
/// address that was checked, not to a proxy that resolves the name again.
pub const PROXY_VARS: &[&str] = &[
    "http_proxy",
    "https_proxy",
    "all_proxy",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "ALL_PROXY",
];

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
        let remote = |transport, host: &str, port, path: Option<&str>| {
            Ok(RepoLocation::Remote(Remote {
                transport,
                host: host.into(),
                port,
                path: path.map(str::to_owned),
            }))
        };
        assert_eq!(
            locate("https://github.com/a/b.git"),
            remote(Transport::Https, "github.com", 443, Some("a/b"))
        );
        assert_eq!(
            locate("ssh://git@h:2222/a.git"),
            remote(Transport::Ssh, "h", 2222, None)
        );
        assert_eq!(
            locate("git@GitHub.com:a/b.git"),
            remote(Transport::Ssh, "github.com", 22, Some("a/b"))
        );
        assert_eq!(
            locate("host:repo"),
            remote(Transport::Ssh, "host", 22, None)
        );
        assert_eq!(
            locate("git@[::1]:a/b"),
            remote(Transport::Ssh, "::1", 22, Some("a/b"))
        );
        assert_eq!(
            locate("git://127.0.0.1:9451/x"),
            remote(Transport::Git, "127.0.0.1", 9451, None)
        );
        assert_eq!(
            locate("http://[::1]/x"),
            remote(Transport::Http, "::1", 80, None)
        );
        assert_eq!(
            locate("/srv/repo"),
            Ok(RepoLocation::Local("/srv/repo".into()))
        );
        assert_eq!(locate("./a:b"), Ok(RepoLocation::Local("./a:b".into())));
        assert!(locate("--upload-pack=x").is_err());
    }

    #[test]
    fn only_gits_network_transports_and_paths_are_taken() {
        for bad in [
            "fd::3",
            "fd::3/x",
            "ext::sh -c touch% /tmp/pwned",
            "EXT::x",
            "persistent-https::https://h/x",
            "ftp://h/x",
            "rsync://h/x",
            "foo://h/x",
            "ssh://-oProxyCommand=x/y",
            "https://:443/x",
            "-u:x",
        ] {
            assert!(locate(bad).is_err(), "{bad:?} accepted");
        }
        assert!(matches!(locate("./a::b"), Ok(RepoLocation::Local(_))));
    }

    #[test]
    fn urls_are_shown_without_credentials() {
        assert_eq!(
            shown("https://x-access-token:ghp_secret@github.com/a/b.git"),
            "https://github.com/a/b.git"
        );
        assert_eq!(shown("git@github.com:a/b"), "git@github.com:a/b");
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
