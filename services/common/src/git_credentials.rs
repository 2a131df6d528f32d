//! Git credentials the mesh holds per tenant and host, for the host-side git of the
//! gateway (its repository check) and the provisioner (its clones): never a sandbox's.
//!
//! The operator gives them in one TOML file (`FORKYARD_GIT_CREDENTIALS`), typically a
//! Kubernetes Secret mounted as a file; it is read again when it changes (its mtime or
//! size), so a rotated token or a new tenant needs no restart. Secrets themselves may
//! live in files of their own (`token_file`, `ssh_key_file`), read at each use:
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
//! ```
//!
//! `GITHUB_TOKEN`, when set, is one more entry: github.com, every tenant.
//!
//! A tenant's run gets the most specific entry for its repository's host among its own
//! and the shared ones (its own first; `host:port` before `host` before `*.domain`).
//! A token reaches git only through the environment of the one git process that uses
//! it (`http.<url>.extraHeader` by `GIT_CONFIG_*`), never a command line, a file of the
//! repository, a URL or a log: `Debug` and `Display` never print it.

use crate::repo_location::{Remote, Transport};
use base64::Engine as _;
use serde::Deserialize;
use std::{
    path::{Path, PathBuf},
    sync::Mutex,
    time::SystemTime,
};

/// The setting that names the file.
pub const SETTING: &str = "FORKYARD_GIT_CREDENTIALS";

/// A secret's text: never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(…)")
    }
}

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

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    host: String,
    tenants: Vec<String>,
    #[serde(default)]
    username: Option<String>,
    #[serde(default)]
    token: Option<String>,
    #[serde(default)]
    token_file: Option<PathBuf>,
    #[serde(default)]
    ssh_key_file: Option<PathBuf>,
    #[serde(default)]
    known_hosts_file: Option<PathBuf>,
}

impl Entry {
    fn check(&self) -> Result<(), String> {
        let http = self.token.is_some() || self.token_file.is_some();
        let ssh = self.ssh_key_file.is_some();
        if http == ssh {
            return Err(format!(
                "credential for {}: give a token (token or token_file) or an ssh_key_file, one of them",
                self.host
            ));
        }
        if ssh && self.known_hosts_file.is_none() {
            return Err(format!(
                "credential for {}: an ssh_key_file needs a known_hosts_file (the host's key: no trust on first use)",
                self.host
            ));
        }
        if self.tenants.is_empty() {
            return Err(format!(
                "credential for {}: tenants is empty (name them, or [\"*\"] for every tenant)",
                self.host
            ));
        }
        if self.host.is_empty() || self.host.contains('/') || self.host.contains('@') {
            return Err(format!(
                "credential host {:?} is not a host name",
                self.host
            ));
        }
        Ok(())
    }

    /// How well the entry's host names `host:port` (0: not at all).
    fn host_match(&self, host: &str, port: u16) -> u8 {
        let pattern = self.host.to_ascii_lowercase();
        if let Some(domain) = pattern.strip_prefix("*.") {
            return u8::from(host.ends_with(&format!(".{domain}")));
        }
        match pattern.rsplit_once(':') {
            Some((h, p)) if p.parse::<u16>().is_ok() => {
                if h == host && p.parse::<u16>() == Ok(port) {
                    3
                } else {
                    0
                }
            }
            _ => 2 * u8::from(pattern == host),
        }
    }

    fn tenant_match(&self, tenant: &str) -> u8 {
        if self.tenants.iter().any(|t| t == tenant) {
            2
        } else {
            u8::from(self.tenants.iter().any(|t| t == "*"))
        }
    }

    fn for_transport(&self, transport: Transport) -> bool {
        match transport {
            Transport::Ssh => self.ssh_key_file.is_some(),
            Transport::Https | Transport::Http => self.ssh_key_file.is_none(),
            Transport::Git => false,
        }
    }

    /// The credential, its secret read now (a rotated file applies at once).
    fn credential(&self) -> Result<Credential, String> {
        if let (Some(key_file), Some(known_hosts)) = (&self.ssh_key_file, &self.known_hosts_file) {
            return Ok(Credential::SshKey {
                key_file: key_file.clone(),
                known_hosts: known_hosts.clone(),
            });
        }
        let token = match (&self.token, &self.token_file) {
            (Some(t), _) => t.clone(),
            (None, Some(file)) => std::fs::read_to_string(file)
                .map_err(|e| format!("credential for {}: {}: {e}", self.host, file.display()))?
                .trim()
                .to_owned(),
            (None, None) => unreachable!("checked when loaded"),
        };
        Ok(Credential::Token {
            username: self
                .username
                .clone()
                .unwrap_or_else(|| "x-access-token".into()),
            token: Secret(token),
        })
    }
}

/// The file as last read.
#[derive(Default)]
struct Loaded {
    stamp: Option<(SystemTime, u64)>,
    entries: Vec<Entry>,
}

/// The mesh's git credentials: the operator's file (read again when it changes) and
/// `GITHUB_TOKEN`.
pub struct GitCredentials {
    file: Option<PathBuf>,
    github_token: Option<Entry>,
    loaded: Mutex<Loaded>,
}

impl std::fmt::Debug for GitCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GitCredentials")
            .field("file", &self.file)
            .field("github_token", &self.github_token.is_some())
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
        }
    }

    /// From `file` (the setting's value; `None`: no file) and `github_token`. The file is
    /// read now: a file that cannot be read or parsed is a configuration error.
    pub fn open(file: Option<PathBuf>, github_token: Option<String>) -> Result<Self, String> {
        let github_token = github_token
            .map(|t| t.trim().to_owned())
            .filter(|t| !t.is_empty())
            .map(|token| Entry {
                host: "github.com".into(),
                tenants: vec!["*".into()],
                username: None,
                token: Some(token),
                token_file: None,
                ssh_key_file: None,
                known_hosts_file: None,
            });
        let creds = Self {
            file,
            github_token,
            loaded: Mutex::default(),
        };
        creds.reload()?;
        Ok(creds)
    }

    /// Read the file again if it changed since; on an error the entries read last stay.
    fn reload(&self) -> Result<(), String> {
        let Some(file) = &self.file else {
            return Ok(());
        };
        let meta =
            std::fs::metadata(file).map_err(|e| format!("{SETTING} {}: {e}", file.display()))?;
        let stamp = (
            meta.modified().unwrap_or(SystemTime::UNIX_EPOCH),
            meta.len(),
        );
        let mut loaded = self
            .loaded
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
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
        };
        tracing::info!(file = %file.display(), credentials = loaded.entries.len(), "git credentials loaded");
        Ok(())
    }

    /// The credential `tenant` may use for `remote`, if any: its own most specific one,
    /// else the operator's shared one. `Err`: its secret could not be read.
    pub fn for_remote(&self, tenant: &str, remote: &Remote) -> Result<Option<Credential>, String> {
        if let Err(e) = self.reload() {
            tracing::warn!(error = %e, "git credentials not reloaded; the last ones read stay");
        }
        let loaded = self
            .loaded
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let best = loaded
            .entries
            .iter()
            .chain(self.github_token.iter())
            .filter(|e| e.for_transport(remote.transport))
            .map(|e| {
                (
                    e.tenant_match(tenant),
                    e.host_match(&remote.host, remote.port),
                    e,
                )
            })
            .filter(|(t, h, _)| *t > 0 && *h > 0)
            .max_by_key(|(t, h, _)| (*t, *h));
        best.map(|(_, _, e)| e.credential()).transpose()
    }
}

#[cfg(test)]
#[path = "git_credentials_tests.rs"]
mod tests;

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
