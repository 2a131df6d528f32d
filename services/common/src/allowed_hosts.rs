//! The hosts an operator lets callers make a service reach on their behalf: registries
//! images are pulled from (`FORKYARD_ALLOWED_REGISTRIES`) and git hosts repositories are
//! read from (`FORKYARD_ALLOWED_GIT_HOSTS`). A caller who could name any host could make
//! the service a port scanner of its own network, or reach a metadata service, with the
//! service's own position and credentials.
//!
//! The rule: an empty list admits any host by name, a list only the hosts it matches
//! (`host`, `host:port`, `*.domain`, `*.domain:port`); then every address the host
//! resolves to must be public ([`crate::hosts::internal`]), unless an exact entry (not a
//! `*.` one) lists the host: the operator's own registry or git server on a private
//! network is named, never reached by a name a caller made up.

use crate::hosts;
use std::net::{IpAddr, SocketAddr};

/// Hosts a setting admits.
#[derive(Debug, Clone)]
pub struct AllowedHosts {
    setting: &'static str,
    entries: Vec<Entry>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    /// Normalised: lowercase, no brackets or trailing dot, an IP in its canonical form.
    host: String,
    /// `*.host`: the host's subdomains (not the host itself).
    wildcard: bool,
    port: Option<u16>,
}

/// Why a host may not be reached. The display is for logs and operators; what callers
/// see is decided where the refusal is turned into an error (one message for every way a
/// host cannot be reached, so that no caller learns which ports answer).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("{host} is not one of the hosts {setting} allows")]
    NotListed { host: String, setting: &'static str },
    #[error("{host} cannot be resolved: {reason}")]
    Unresolved { host: String, reason: String },
    #[error(
        "{host} resolves to {addr}, not a public address ({block}); the operator may list the host in {setting}"
    )]
    NotPublic {
        host: String,
        addr: IpAddr,
        block: &'static str,
        setting: &'static str,
    },
}

/// The longest host name DNS can carry.
pub const MAX_HOST_LEN: usize = 253;

/// `host` lowercased, without IPv6 brackets or a trailing dot, an IP address canonical
/// (`0:0::1` is `::1`), so that one host has one spelling.
pub fn normal_host(host: &str) -> String {
    let h = host.trim_start_matches('[').trim_end_matches(']');
    let h = h.strip_suffix('.').unwrap_or(h).to_ascii_lowercase();
    match h.parse::<IpAddr>() {
        Ok(ip) => ip.to_string(),
        Err(_) => h,
    }
}

/// `host`, `host:port`, `[v6]`, `[v6]:port` or a bare IPv6 address: (host, port).
/// `Err` says what is wrong with the port.
pub fn split_host_port(authority: &str) -> Result<(&str, Option<u16>), String> {
    if let Some(rest) = authority.strip_prefix('[') {
        let (host, after) = rest
            .split_once(']')
            .ok_or_else(|| format!("{authority:?}: an unclosed '['"))?;
        return match after.strip_prefix(':') {
            Some(p) => Ok((host, Some(port(authority, p)?))),
            None if after.is_empty() => Ok((host, None)),
            None => Err(format!("{authority:?}: text after ']'")),
        };
    }
    if authority.parse::<std::net::Ipv6Addr>().is_ok() {
        return Ok((authority, None));
    }
    match authority.rsplit_once(':') {
        Some((host, p)) => Ok((host, Some(port(authority, p)?))),
        None => Ok((authority, None)),
    }
}

fn port(authority: &str, p: &str) -> Result<u16, String> {
    match p.parse::<u16>() {
        Ok(0) | Err(_) => Err(format!(
            "{authority:?}: the port must be a number from 1 to 65535"
        )),
        Ok(n) => Ok(n),
    }
}

/// Whether `host` (normalised) is a host name or an IP address: letters, digits, '-',
/// '_' and '.' in labels of 1 to 63, at most [`MAX_HOST_LEN`] in all.
pub fn valid_host(host: &str) -> bool {
    if host.parse::<IpAddr>().is_ok() {
        return true;
    }
    !host.is_empty()
        && host.len() <= MAX_HOST_LEN
        && host.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && !l.starts_with('-')
                && l.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        })
}

impl AllowedHosts {
    /// Any host whose addresses are all public (an empty setting).
    pub fn any_public(setting: &'static str) -> Self {
        Self {
            setting,
            entries: Vec::new(),
        }
    }

    /// The setting's entries (blank ones ignored); `Err` names the setting and the entry.
    pub fn parse(setting: &'static str, list: &[String]) -> Result<Self, String> {
        let mut entries = Vec::new();
        for raw in list.iter().map(|e| e.trim()).filter(|e| !e.is_empty()) {
            entries.push(Self::entry(raw).map_err(|why| format!("{setting}: {why}"))?);
        }
        Ok(Self { setting, entries })
    }

    fn entry(raw: &str) -> Result<Entry, String> {
        if raw == "*" {
            return Err("\"*\" is not an entry; leave the list empty for any public host".into());
        }
        let (host, port) = split_host_port(raw)?;
        let (host, wildcard) = match host.strip_prefix("*.") {
            Some(domain) => (domain, true),
            None => (host, false),
        };
        let host = normal_host(host);
        let ok = valid_host(&host) && !(wildcard && host.parse::<IpAddr>().is_ok());
        if !ok {
            return Err(format!(
                "{raw:?} is not a host, host:port, *.domain or *.domain:port"
            ));
        }
        Ok(Entry {
            host,
            wildcard,
            port,
        })
    }

    /// No entries: any host whose addresses are all public.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The setting's name, for messages.
    pub fn setting(&self) -> &'static str {
        self.setting
    }

    /// Whether a caller may name `host:port` at all (an empty list: any host).
    pub fn admits(&self, host: &str, port: u16) -> bool {
        let host = normal_host(host);
        self.entries.is_empty()
            || self.entries.iter().any(|e| {
                let host_ok = if e.wildcard {
                    host.strip_suffix(e.host.as_str())
                        .is_some_and(|sub| sub.len() > 1 && sub.ends_with('.'))
                } else {
                    host == e.host
                };
                host_ok && e.port.is_none_or(|p| p == port)
            })
    }

    /// Whether an exact entry names `host` (on `port`; `None`: on any port), so that its
    /// addresses may be the operator's own network's.
    pub fn lists(&self, host: &str, port: Option<u16>) -> bool {
        let host = normal_host(host);
        self.entries.iter().any(|e| {
            !e.wildcard && e.host == host && (e.port.is_none() || port.is_none() || e.port == port)
        })
    }

    /// `Ok` when `host` (on `port`, when known) may be reached at every one of `addrs`.
    pub fn check_addrs(
        &self,
        host: &str,
        port: Option<u16>,
        addrs: impl IntoIterator<Item = IpAddr>,
    ) -> Result<(), Refusal> {
        if self.lists(host, port) {
            return Ok(());
        }
        for addr in addrs {
            if let Some(block) = hosts::special_block(addr) {
                return Err(Refusal::NotPublic {
                    host: host.to_owned(),
                    addr,
                    block,
                    setting: self.setting,
                });
            }
        }
        Ok(())
    }

    /// The addresses of `host:port` once it is admitted and each of them checked: connect
    /// to these (and no others), so that a second lookup cannot give another answer.
    pub async fn resolve(&self, host: &str, port: u16) -> Result<Vec<SocketAddr>, Refusal> {
        if !self.admits(host, port) {
            return Err(Refusal::NotListed {
                host: host.to_owned(),
                setting: self.setting,
            });
        }
        let unresolved = |reason: String| Refusal::Unresolved {
            host: host.to_owned(),
            reason,
        };
        let addrs: Vec<SocketAddr> = match normal_host(host).parse::<IpAddr>() {
            Ok(ip) => vec![SocketAddr::new(ip, port)],
            Err(_) => tokio::net::lookup_host((host, port))
                .await
                .map_err(|e| unresolved(e.to_string()))?
                .collect(),
        };
        if addrs.is_empty() {
            return Err(unresolved("no addresses".into()));
        }
        self.check_addrs(host, Some(port), addrs.iter().map(SocketAddr::ip))?;
        Ok(addrs)
    }
}

#[cfg(test)]
#[path = "allowed_hosts_tests.rs"]
mod tests;
