//! Which repositories a run may name. A local path (plain or `file://`) is read by git
//! on the gateway's and the provisioner's hosts, so with tenants it is a way to read any
//! repository there: local paths are off unless the operator lists the roots they may
//! come from (`FORKYARD_LOCAL_REPO_ROOTS`), and never inside the sandboxes' own storage.
//! A remote one only from the git hosts the operator allows (`FORKYARD_ALLOWED_GIT_HOSTS`,
//! by name here; its addresses are checked where it is read, `crate::repo_check`).

use crate::error::GatewayError;
use forkyard_common::{
    allowed_hosts::AllowedHosts,
    git_credentials::GitCredentials,
    repo_location::{self, RepoLocation},
};
use std::{
    path::{Path, PathBuf},
    sync::Arc,
};

/// The setting, as named in errors and logs.
pub const SETTING: &str = "--local-repo-roots (FORKYARD_LOCAL_REPO_ROOTS)";
/// The git hosts' setting.
pub const GIT_HOSTS_SETTING: &str = "--allowed-git-hosts (FORKYARD_ALLOWED_GIT_HOSTS)";

#[derive(Debug, Clone)]
pub enum LocalRepos {
    /// Every local path (the local stack, authentication off).
    Any,
    /// Only paths under these (canonical) directories; none when empty.
    Under(Vec<PathBuf>),
}

#[derive(Debug, Clone)]
pub struct RepoPolicy {
    pub local: LocalRepos,
    /// Sandboxes' workspaces, templates, trash and snapshots: never a repository.
    protected: Vec<PathBuf>,
    /// The hosts remote repositories may be read from.
    pub git_hosts: AllowedHosts,
    /// The git credentials the mesh holds per tenant and host.
    pub credentials: Arc<GitCredentials>,
}

impl Default for RepoPolicy {
    fn default() -> Self {
        Self {
            local: LocalRepos::Any,
            protected: Vec::new(),
            git_hosts: AllowedHosts::any_public(GIT_HOSTS_SETTING),
            credentials: Arc::new(GitCredentials::none()),
        }
    }
}

impl RepoPolicy {
    /// From the setting: unset means every path with authentication off and none with
    /// it on; `*` every path; otherwise comma-separated directories that must exist.
    pub fn from_setting(
        setting: Option<&str>,
        authenticated: bool,
        state_dir: &Path,
    ) -> Result<Self, String> {
        let local = match setting.map(str::trim) {
            None if authenticated => LocalRepos::Under(Vec::new()),
            None | Some("*") => LocalRepos::Any,
            Some(list) => LocalRepos::Under(
                list.split(',')
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(|root| {
                        std::fs::canonicalize(root).map_err(|e| format!("{SETTING}: {root}: {e}"))
                    })
                    .collect::<Result<_, _>>()?,
            ),
        };
        Ok(Self {
            local,
            protected: repo_location::sandbox_data_dirs(state_dir),
            git_hosts: AllowedHosts::any_public(GIT_HOSTS_SETTING),
            credentials: Arc::new(GitCredentials::none()),
        })
    }

    /// With the mesh's git credentials.
    #[must_use]
    pub fn with_credentials(mut self, credentials: Arc<GitCredentials>) -> Self {
        self.credentials = credentials;
        self
    }

    /// With the git hosts of `--allowed-git-hosts` (empty: any host with public addresses).
    pub fn with_git_hosts(mut self, list: &[String]) -> Result<Self, String> {
        self.git_hosts = AllowedHosts::parse(GIT_HOSTS_SETTING, list)?;
        Ok(self)
    }

    /// The repository string the run will use: a URL as given, a local path resolved
    /// (so what was checked is what is cloned, whatever a symlink does later).
    pub fn check(&self, repo: &str) -> Result<String, GatewayError> {
        if repo_location::carries_credentials(repo) {
            // Not echoed: the part a caller put there is often a token.
            return Err(GatewayError::field(
                "repo",
                "must not carry credentials (a user name or token in the URL): the operator gives the mesh each host's credentials (FORKYARD_GIT_CREDENTIALS, or GITHUB_TOKEN)",
            ));
        }
        let path = match repo_location::locate(repo) {
            Ok(RepoLocation::Remote(r)) => {
                if !self.git_hosts.admits(&r.host, r.port) {
                    return Err(GatewayError::field(
                        "repo",
                        format!(
                            "{} is not a git host runs may read from here (the operator lists them in {GIT_HOSTS_SETTING})",
                            r.host
                        ),
                    ));
                }
                return Ok(repo.to_owned());
            }
            Ok(RepoLocation::Local(path)) => path,
            Err(why) => return Err(GatewayError::field("repo", why)),
        };
        if matches!(&self.local, LocalRepos::Under(roots) if roots.is_empty()) {
            return Err(GatewayError::PermissionDenied(format!(
                "repo: local paths are not allowed on this gateway (the operator allows them with {SETTING})"
            )));
        }
        let canonical = repo_location::canonical_local(&path).map_err(|_| {
            GatewayError::field(
                "repo",
                format!("{repo:?} does not exist (not a URL and no such path)"),
            )
        })?;
        if self
            .protected
            .iter()
            .any(|d| repo_location::is_within(&canonical, d))
        {
            return Err(GatewayError::field(
                "repo",
                "is inside the sandboxes' storage (another sandbox's workspace, a template or a snapshot)",
            ));
        }
        if let LocalRepos::Under(roots) = &self.local
            && !roots.iter().any(|r| canonical.starts_with(r))
        {
            return Err(GatewayError::PermissionDenied(format!(
                "repo: {} is outside the local repository roots allowed by {SETTING}",
                canonical.display()
            )));
        }
        canonical
            .into_os_string()
            .into_string()
            .map_err(|_| GatewayError::field("repo", "resolves to a path that is not UTF-8"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::Code;

    fn code(r: Result<String, GatewayError>) -> Code {
        tonic::Status::from(r.unwrap_err()).code()
    }

    #[test]
    fn file_urls_get_the_same_checks_as_paths() {
        let tmp = tempfile::tempdir().unwrap();
        let state = tmp.path().join("state");
        let ws = state.join("sandboxes/sbx-1/workspace");
        std::fs::create_dir_all(&ws).unwrap();
        let policy = RepoPolicy::from_setting(None, false, &state).unwrap();
        for repo in [
            ws.display().to_string(),
            format!("file://{}", ws.display()),
            format!("file://localhost{}/", ws.display()),
            format!("{}/sandboxes/sbx-1/../sbx-1/workspace", state.display()),
        ] {
            assert_eq!(code(policy.check(&repo)), Code::InvalidArgument, "{repo}");
        }
        // Through a symlink outside the state dir, too.
        let link = tmp.path().join("innocent");
        std::os::unix::fs::symlink(&ws, &link).unwrap();
        assert_eq!(
            code(policy.check(&format!("file://{}", link.display()))),
            Code::InvalidArgument
        );
        let repo = tmp.path().join("repo");
        std::fs::create_dir(&repo).unwrap();
        let canonical = std::fs::canonicalize(&repo).unwrap();
        assert_eq!(
            policy.check(&format!("file://{}", repo.display())).unwrap(),
            canonical.to_str().unwrap()
        );
        assert_eq!(
            policy.check("https://example.com/r.git").unwrap(),
            "https://example.com/r.git"
        );
    }

    #[test]
    fn with_tenants_local_paths_need_a_listed_root() {
        let tmp = tempfile::tempdir().unwrap();
        let allowed = tmp.path().join("allowed");
        let other = tmp.path().join("other");
        std::fs::create_dir_all(allowed.join("r")).unwrap();
        std::fs::create_dir_all(other.join("r")).unwrap();
        let state = tmp.path().join("state");
        let off = RepoPolicy::from_setting(None, true, &state).unwrap();
        let err = off.check(allowed.join("r").to_str().unwrap()).unwrap_err();
        assert!(
            err.to_string().contains("FORKYARD_LOCAL_REPO_ROOTS"),
            "{err}"
        );
        assert_eq!(tonic::Status::from(err).code(), Code::PermissionDenied);
        assert!(off.check("https://example.com/r.git").is_ok());

        let setting = allowed.display().to_string();
        let roots = RepoPolicy::from_setting(Some(&setting), true, &state).unwrap();
        assert!(roots.check(allowed.join("r").to_str().unwrap()).is_ok());
        assert!(
            roots
                .check(&format!("file://{}", allowed.join("r").display()))
                .is_ok()
        );
        assert_eq!(
            code(roots.check(other.join("r").to_str().unwrap())),
            Code::PermissionDenied
        );
        assert_eq!(
            code(roots.check(&format!("{}/../other/r", allowed.display()))),
            Code::PermissionDenied
        );
        let any = RepoPolicy::from_setting(Some("*"), true, &state).unwrap();
        assert!(any.check(other.join("r").to_str().unwrap()).is_ok());
        assert!(RepoPolicy::from_setting(Some("/no/such/root"), true, &state).is_err());
    }
}
