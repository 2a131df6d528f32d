//! Git credentials the mesh holds per tenant and host, for the host-side git of the
//! gateway (its repository check) and the provisioner (its clones), and for the forges'
//! APIs (pull and merge requests, `crate::forge`): never a sandbox's.
//!
//! The operator gives them in one TOML file (`FORKYARD_GIT_CREDENTIALS`), typically a
//! key of a Kubernetes Secret mounted as a directory (k8s/README.md); it is read again
//! when it changes (its mtime or size), so a rotated token or a new tenant needs no
//! restart. A file not there (an optional Secret not created yet) gives no entries until
//! it appears. Secrets themselves may
//! live in files of their own (`token_file`, `ssh_key_file`, `app_key_file`), read at
//! each use:
//!
//! ```toml
//! [[credential]]
//! host = "github.com"              # host, host:port or *.domain
//! tenants = ["team-a"]             # ["*"]: every tenant (the operator's shared one)
//! token_file = "/secrets/team-a"   # or token = "…"; sent as basic auth
//! username = "x-access-token"      # optional (GitHub takes any; GitLab: oauth2)
//!
//! [[credential]]
//! host = "git.internal:2222"
//! tenants = ["team-b"]
//! ssh_key_file = "/secrets/team-b-deploy-key"
//! known_hosts_file = "/secrets/known_hosts"   # required: no trust on first use
//! forge = "gitlab"                            # its API, for merge requests:
//! api = "https://git.internal/api/v4"
//! api_token_file = "/secrets/team-b-gitlab"   # an ssh key calls no API
//!
//! [[credential]]
//! host = "github.com"
//! tenants = ["team-c"]
//! app_id = 123456                              # a GitHub App: installation tokens
//! app_key_file = "/secrets/app.pem"            # minted when needed (crate::github_app)
//! installation_id = 7890123
//! ```
//!
//! `GITHUB_TOKEN`, when set, is one more entry: github.com, every tenant.
//!
//! A tenant's run gets the most specific entry for its repository's host among its own
//! and the shared ones (its own first; `host:port` before `host` before `*.domain`).
//! A host's forge is what its entry says (`forge`, `api`), else github.com's and
//! gitlab.com's own; any other host has none unless its entry names one.
//! A token reaches git only through the environment of the one git process that uses
//! it (`http.<url>.extraHeader` by `GIT_CONFIG_*`), never a command line, a file of the
//! repository, a URL or a log: `Debug` and `Display` never print it.

mod entry;

pub use crate::secret::Secret;
use crate::{
    forge::{ForgeAccess, ForgeError},
    github_app::InstallationTokens,
    repo_location::{Remote, Transport},
};
use base64::Engine as _;
use entry::Entry;
use serde::Deserialize;
use std::{
    path::{Path, PathBuf},
    sync::Mutex,
    time::SystemTime,
};

/// The setting that names the file.
pub const SETTING: &str = "FORKYARD_GIT_CREDENTIALS";

/// One credential, ready for git.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Credential {
    /// HTTPS basic auth: a personal or fine-grained token, a GitLab token, or a git
    /// server's password.
    Token { username: String, token: Secret },
    /// An SSH deploy key, with the host keys to accept.
    SshKey {
        key_file: PathBuf,
        known_hosts: PathBuf,
    },
}

impl Credential {
    /// The environment host git needs to use it against `remote`.
    pub fn git_env(&self, remote: &Remote) -> Vec<(String, String)> {
        match self {
            Credential::Token { username, token } => {
                let basic = base64::engine::general_purpose::STANDARD
                    .encode(format!("{username}:{}", token.expose()));
                vec![
                    ("GIT_CONFIG_COUNT".into(), "1".into()),
                    (
                        "GIT_CONFIG_KEY_0".into(),
                        format!("http.{}.extraHeader", url_prefix(remote)),
                    ),
                    (
                        "GIT_CONFIG_VALUE_0".into(),
                        format!("Authorization: Basic {basic}"),
                    ),
                ]
            }
            Credential::SshKey {
                key_file,
                known_hosts,
            } => vec![(
                "GIT_SSH_COMMAND".into(),
                format!(
                    "ssh -oBatchMode=yes -oIdentitiesOnly=yes -oIdentityAgent=none \
                     -oStrictHostKeyChecking=yes -oUserKnownHostsFile={} -i {}",
                    shell_quote(known_hosts),
                    shell_quote(key_file)
                ),
            )],
        }
    }
}

/// `https://host[:port]/`: what `http.<url>.*` settings match (the default port left
/// out, as git compares it).
fn url_prefix(remote: &Remote) -> String {
    let (scheme, default) = match remote.transport {
        Transport::Http => ("http", 80),
        _ => ("https", 443),
    };
    let host = if remote.host.contains(':') {
        format!("[{}]", remote.host)
    } else {
        remote.host.clone()
    };
    if remote.port == default {
        format!("{scheme}://{host}/")
    } else {
        format!("{scheme}://{host}:{}/", remote.port)
    }
}

fn shell_quote(p: &Path) -> String {
    format!("'{}'", p.display().to_string().replace('\'', r"'\''"))
}

/// The file's shape.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileShape {
    #[serde(default)]
    credential: Vec<Entry>,
}

/// The file as last read.
#[derive(Default)]
struct Loaded {
    stamp: Option<(SystemTime, u64)>,
    entries: Vec<Entry>,
    /// The file was not there when last looked for (said once, not at every use).
    absent: bool,
}

impl Loaded {
    /// No file: no entries from it. An optional Kubernetes Secret that does not exist
    /// yet mounts an empty directory, so a missing file is a state the mesh starts and
    /// runs in (told once), not an error: the file is read when it appears.
    fn absent(&mut self, file: &Path) {
        if !self.absent {
            tracing::warn!(
                file = %file.display(),
                "git credentials file not found: none from it until it appears"
            );
        }
        *self = Loaded {
            stamp: None,
            entries: Vec::new(),
            absent: true,
        };
    }
}

/// The mesh's git credentials: the operator's file (read again when it changes) and
/// `GITHUB_TOKEN`.
pub struct GitCredentials {
    file: Option<PathBuf>,
    github_token: Option<Entry>,
    loaded: Mutex<Loaded>,
    /// GitHub App installation tokens minted so far.
    apps: InstallationTokens,
}

impl std::fmt::Debug for GitCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GitCredentials")
            .field("file", &self.file)
            .field("github_token", &self.github_token.is_some())
            .field("apps", &self.apps)
            .finish()
    }
}

impl GitCredentials {
    /// None at all.
    pub fn none() -> Self {
        Self {
            file: None,
            github_token: None,
            loaded: Mutex::default(),
            apps: InstallationTokens::default(),
        }
    }

    /// From `file` (the setting's value; `None`: no file) and `github_token`. The file is
    /// read now: a file that cannot be read or parsed is a configuration error; one that
    /// is not there yet gives no entries until it appears.
    pub fn open(file: Option<PathBuf>, github_token: Option<String>) -> Result<Self, String> {
        let github_token = github_token
            .map(|t| t.trim().to_owned())
            .filter(|t| !t.is_empty())
            .map(|token| Entry {
                host: "github.com".into(),
                tenants: vec!["*".into()],
                token: Some(Secret::new(token)),
                ..Entry::default()
            });
        let creds = Self {
            file,
            github_token,
            loaded: Mutex::default(),
            apps: InstallationTokens::default(),
        };
        creds.reload()?;
        // A file not there is said once: here if logging is set up, else at its first
        // use (the provisioner opens its credentials before its logging starts).
        if !tracing::dispatcher::has_been_set() {
            creds.lock().absent = false;
        }
        Ok(creds)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Loaded> {
        self.loaded
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Read the file again if it changed since; on an error the entries read last stay.
    /// A file that is gone leaves none: deleting it revokes what it held.
    fn reload(&self) -> Result<(), String> {
        let Some(file) = &self.file else {
            return Ok(());
        };
        let mut loaded = self.lock();
        let meta = match std::fs::metadata(file) {
            Ok(meta) => meta,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                loaded.absent(file);
                return Ok(());
            }
            Err(e) => return Err(format!("{SETTING} {}: {e}", file.display())),
        };
        let stamp = (
            meta.modified().unwrap_or(SystemTime::UNIX_EPOCH),
            meta.len(),
        );
        if loaded.stamp == Some(stamp) {
            return Ok(());
        }
        let text = std::fs::read_to_string(file)
            .map_err(|e| format!("{SETTING} {}: {e}", file.display()))?;
        let shape: FileShape = toml::from_str(&text)
            .map_err(|e| format!("{SETTING} {}: {}", file.display(), e.message()))?;
        for e in &shape.credential {
            e.check()
                .map_err(|why| format!("{SETTING} {}: {why}", file.display()))?;
        }
        *loaded = Loaded {
            stamp: Some(stamp),
            entries: shape.credential,
            absent: false,
        };
        tracing::info!(file = %file.display(), credentials = loaded.entries.len(), "git credentials loaded");
        Ok(())
    }

    /// The entry `tenant` may use for `remote` among those `usable` keeps: its own most
    /// specific one, else the operator's shared one; of two as specific, one for the
    /// remote's transport. A copy: no lock is held while its token is minted.
    fn best(
        &self,
        tenant: &str,
        remote: &Remote,
        usable: impl Fn(&Entry) -> bool,
    ) -> Option<Entry> {
        if let Err(e) = self.reload() {
            tracing::warn!(error = %e, "git credentials not reloaded; the last ones read stay");
        }
        let loaded = self.lock();
        loaded
            .entries
            .iter()
            .chain(self.github_token.iter())
            .filter(|e| usable(e))
            .map(|e| {
                let rank = (
                    e.tenant_match(tenant),
                    e.host_match(&remote.host, remote.port),
                    u8::from(e.for_transport(remote.transport)),
                );
                (rank, e)
            })
            .filter(|((t, h, _), _)| *t > 0 && *h > 0)
            .max_by_key(|(rank, _)| *rank)
            .map(|(_, e)| e.clone())
    }

    /// The credential `tenant` may use for `remote`, if any, without network I/O: a
    /// GitHub App's entry is an `Err` here ([`Self::resolve`] mints its token). `Err`:
    /// its secret could not be read.
    pub fn for_remote(&self, tenant: &str, remote: &Remote) -> Result<Option<Credential>, String> {
        self.best(tenant, remote, |e| e.for_transport(remote.transport))
            .map(|e| e.credential())
            .transpose()
    }

    /// The credential `tenant` may use for `remote`, if any: its own most specific one,
    /// else the operator's shared one; for a GitHub App, an installation token (minted
    /// if none cached has five minutes left) as `x-access-token`. `Err` names the
    /// entry's host: its secret could not be read, or no token could be minted.
    pub async fn resolve(
        &self,
        tenant: &str,
        remote: &Remote,
    ) -> Result<Option<Credential>, String> {
        let Some(entry) = self.best(tenant, remote, |e| e.for_transport(remote.transport)) else {
            return Ok(None);
        };
        let Some(app) = entry.app(remote) else {
            return entry.credential().map(Some);
        };
        let token = self
            .apps
            .token(&app)
            .await
            .map_err(|e| format!("credential for {}: {e}", entry.host))?;
        Ok(Some(Credential::Token {
            username: "x-access-token".into(),
            token,
        }))
    }

    /// How `tenant` calls the API of `remote`'s forge, if its host has one (the entry's
    /// `forge` and `api`, else github.com's and gitlab.com's own) and the tenant an entry
    /// that can call it: a token entry's `api_token` or token, an SSH entry's
    /// `api_token`, a GitHub App's installation token. `Err` names the entry's host and
    /// says whether trying again may help (a mint the API failed).
    pub async fn forge_for(
        &self,
        tenant: &str,
        remote: &Remote,
    ) -> Result<Option<ForgeAccess>, ForgeError> {
        let usable = |e: &Entry| e.has_api_access() && e.forge(remote).is_some();
        let Some(entry) = self.best(tenant, remote, usable) else {
            return Ok(None);
        };
        let Some((forge, api)) = entry.forge(remote) else {
            return Ok(None);
        };
        let token = match entry.app(remote) {
            Some(app) => self
                .apps
                .token(&app)
                .await
                .map_err(|e| e.context(&format!("credential for {}", entry.host)))?,
            None => entry.api_token().map_err(ForgeError::Setup)?,
        };
        Ok(Some(ForgeAccess { forge, api, token }))
    }
}

#[cfg(test)]
#[path = "git_credentials_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "git_credentials_mount_tests.rs"]
mod mount_tests;

/// Whether git's answer (its stderr) says the host wants credentials or
/// refused the ones given: HTTP 401/403, a prompt it could not show, an SSH key refused.
pub fn asks_for_credentials(git_stderr: &str) -> bool {
    const SAYS: &[&str] = &[
        "Authentication failed",
        "could not read Username",
        "could not read Password",
        "terminal prompts disabled",
        "The requested URL returned error: 401",
        "The requested URL returned error: 403",
        "Permission denied (publickey",
        "Host key verification failed",
    ];
    SAYS.iter().any(|s| git_stderr.contains(s))
}
