//! One `[[credential]]` entry of the operator's file: what it is for (tenants, host,
//! transport, forge) and its secret, read when used.

use super::{Credential, Secret};
use crate::{
    forge::Forge,
    github_app::GitHubApp,
    repo_location::{Remote, Transport},
};
use serde::Deserialize;
use std::path::PathBuf;

/// An app's id: a number in GitHub's settings page, or its client id (`Iv1.…`).
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub(super) enum AppId {
    Number(u64),
    Text(String),
}

impl AppId {
    fn text(&self) -> String {
        match self {
            AppId::Number(n) => n.to_string(),
            AppId::Text(t) => t.clone(),
        }
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Entry {
    pub host: String,
    pub tenants: Vec<String>,
    pub username: Option<String>,
    pub token: Option<Secret>,
    pub token_file: Option<PathBuf>,
    pub ssh_key_file: Option<PathBuf>,
    pub known_hosts_file: Option<PathBuf>,
    pub forge: Option<Forge>,
    pub api: Option<String>,
    pub api_token: Option<Secret>,
    pub api_token_file: Option<PathBuf>,
    pub app_id: Option<AppId>,
    pub app_key_file: Option<PathBuf>,
    pub installation_id: Option<u64>,
}

/// What an entry holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Token,
    SshKey,
    App,
}

impl Entry {
    pub fn kind(&self) -> Kind {
        if self.ssh_key_file.is_some() {
            Kind::SshKey
        } else if self.app_id.is_some() || self.app_key_file.is_some() {
            Kind::App
        } else {
            Kind::Token
        }
    }

    pub fn check(&self) -> Result<(), String> {
        if self.host.is_empty() || self.host.contains('/') || self.host.contains('@') {
            return Err(format!(
                "credential host {:?} is not a host name",
                self.host
            ));
        }
        let named = |why: &str| Err(format!("credential for {}: {why}", self.host));
        if self.tenants.is_empty() {
            return named("tenants is empty (name them, or [\"*\"] for every tenant)");
        }
        let token = self.token.is_some() || self.token_file.is_some();
        let app =
            self.app_id.is_some() || self.app_key_file.is_some() || self.installation_id.is_some();
        let given = [token, self.ssh_key_file.is_some(), app];
        if given.iter().filter(|g| **g).count() != 1 {
            return named(
                "give a token (token or token_file), an ssh_key_file or a github app (app_id, app_key_file, installation_id): one of them",
            );
        }
        if self.ssh_key_file.is_some() && self.known_hosts_file.is_none() {
            return named(
                "an ssh_key_file needs a known_hosts_file (the host's key: no trust on first use)",
            );
        }
        if app {
            self.check_app()?;
        }
        self.check_api()
    }

    fn check_app(&self) -> Result<(), String> {
        let named = |why: &str| Err(format!("credential for {}: {why}", self.host));
        if self.app_id.is_none() || self.app_key_file.is_none() || self.installation_id.is_none() {
            return named("a github app needs app_id, app_key_file and installation_id");
        }
        if self.forge == Some(Forge::GitLab) {
            return named("a github app is for forge = \"github\"");
        }
        if self.api_token.is_some() || self.api_token_file.is_some() || self.username.is_some() {
            return named(
                "a github app's installation token is its git and api token: no username, api_token or api_token_file",
            );
        }
        Ok(())
    }

    fn check_api(&self) -> Result<(), String> {
        let named = |why: &str| Err(format!("credential for {}: {why}", self.host));
        if self.api_token.is_some() && self.api_token_file.is_some() {
            return named("give api_token or api_token_file, not both");
        }
        let Some(api) = &self.api else {
            return Ok(());
        };
        if self.forge.is_none() && self.kind() != Kind::App {
            return named("api needs forge = \"github\" or \"gitlab\"");
        }
        // The URL is not repeated: it might carry a password.
        let usable = match url::Url::parse(api) {
            Ok(u) if !u.username().is_empty() || u.password().is_some() => {
                return named("api must not carry credentials (the entry's token is sent)");
            }
            Ok(u) => matches!(u.scheme(), "http" | "https") && u.has_host(),
            Err(_) => false,
        };
        if usable {
            Ok(())
        } else {
            named("api is not an http(s) url with a host")
        }
    }

    /// How well the entry's host names `host:port` (0: not at all).
    pub fn host_match(&self, host: &str, port: u16) -> u8 {
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

    pub fn tenant_match(&self, tenant: &str) -> u8 {
        if self.tenants.iter().any(|t| t == tenant) {
            2
        } else {
            u8::from(self.tenants.iter().any(|t| t == "*"))
        }
    }

    pub fn for_transport(&self, transport: Transport) -> bool {
        match transport {
            Transport::Ssh => self.kind() == Kind::SshKey,
            Transport::Https | Transport::Http => self.kind() != Kind::SshKey,
            Transport::Git => false,
        }
    }

    /// The credential of a token or SSH entry, its secret read now (a rotated file
    /// applies at once). An app's token is minted (`GitCredentials::resolve`).
    pub fn credential(&self) -> Result<Credential, String> {
        match self.kind() {
            Kind::SshKey => Ok(Credential::SshKey {
                key_file: self.ssh_key_file.clone().unwrap_or_default(),
                known_hosts: self.known_hosts_file.clone().unwrap_or_default(),
            }),
            Kind::Token => Ok(Credential::Token {
                username: self
                    .username
                    .clone()
                    .unwrap_or_else(|| "x-access-token".into()),
                token: self.secret(&self.token, &self.token_file, "token")?,
            }),
            Kind::App => Err(format!(
                "credential for {}: a github app's installation token is minted over the network (GitCredentials::resolve)",
                self.host
            )),
        }
    }

    /// Whether the entry can call a forge's API: a token entry, an app, or an SSH entry
    /// given an api_token.
    pub fn has_api_access(&self) -> bool {
        self.kind() != Kind::SshKey || self.api_token.is_some() || self.api_token_file.is_some()
    }

    /// The token a token or SSH entry calls the API with: its api_token, else its token.
    pub fn api_token(&self) -> Result<Secret, String> {
        if self.api_token.is_some() || self.api_token_file.is_some() {
            return self.secret(&self.api_token, &self.api_token_file, "api_token");
        }
        self.secret(&self.token, &self.token_file, "token")
    }

    /// The forge of `remote`'s host and its API, as the entry says or as the host is
    /// known (github.com, gitlab.com); an app is GitHub's. `None`: no forge.
    pub fn forge(&self, remote: &Remote) -> Option<(Forge, url::Url)> {
        let known = Forge::of_host(&remote.host);
        let forge = self
            .forge
            .or((self.kind() == Kind::App).then_some(Forge::GitHub))
            .or(known.map(|(f, _)| f))?;
        let api = match (&self.api, known) {
            (Some(api), _) => api.clone(),
            (None, Some((f, api))) if f == forge => api.to_owned(),
            (None, _) => forge.self_hosted_api(&authority(remote)),
        };
        Some((forge, url::Url::parse(&api).ok()?))
    }

    /// The app installation of an app entry, its tokens scoped to `remote`'s repository.
    pub fn app(&self, remote: &Remote) -> Option<GitHubApp> {
        let (_, api) = self.forge(remote)?;
        Some(GitHubApp {
            api,
            app_id: self.app_id.as_ref()?.text(),
            key_file: self.app_key_file.clone()?,
            installation_id: self.installation_id?,
            repository: remote
                .path
                .as_deref()
                .and_then(|p| p.rsplit('/').next())
                .map(str::to_owned),
        })
    }

    fn secret(
        &self,
        value: &Option<Secret>,
        file: &Option<PathBuf>,
        field: &str,
    ) -> Result<Secret, String> {
        match (value, file) {
            (Some(t), _) => Ok(t.clone()),
            (None, Some(file)) => Ok(Secret::new(
                std::fs::read_to_string(file)
                    .map_err(|e| format!("credential for {}: {}: {e}", self.host, file.display()))?
                    .trim(),
            )),
            (None, None) => Err(format!("credential for {}: no {field}", self.host)),
        }
    }
}

/// `host[:port]` of a self-hosted forge's API: the repository's own port when it is
/// cloned over https, else 443.
fn authority(remote: &Remote) -> String {
    let host = if remote.host.contains(':') {
        format!("[{}]", remote.host)
    } else {
        remote.host.clone()
    };
    if remote.transport == Transport::Https && remote.port != 443 {
        format!("{host}:{}", remote.port)
    } else {
        host
    }
}
