//! Peers by DNS name. A peer address such as `http://sandbox-provisioner:50052` names a
//! service whose name resolves to every replica (a Compose service, a Kubernetes
//! headless Service): the name is looked up again every refresh and the channel follows
//! it, so new replicas get calls and gone ones stop getting them. An IP literal is one
//! fixed peer. `a,b` lists several addresses (each followed the same way).
//!
//! TLS: each replica is dialled by IP and its certificate checked against the name the
//! operator wrote, as one would dial the name itself.

use crate::balance::Balanced;
use std::{
    collections::{BTreeMap, BTreeSet},
    net::{IpAddr, SocketAddr},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::Duration,
};
use tonic::transport::{Channel, Endpoint};

/// How often names are looked up again unless a service sets it
/// ([`DiscoveryArgs::install`]).
const DEFAULT_REFRESH_SECS: u64 = 5;
static REFRESH_SECS: AtomicU64 = AtomicU64::new(DEFAULT_REFRESH_SECS);

/// The service flag that sets how often peer names are looked up again.
#[derive(clap::Args, Debug, Clone)]
pub struct DiscoveryArgs {
    /// Seconds between DNS lookups of peer names (each peer address's name is looked up
    /// again and its replicas followed: new ones get calls, gone ones stop).
    #[arg(long = "discovery-refresh-secs", env = "FORKYARD_DISCOVERY_REFRESH_SECS", default_value_t = DEFAULT_REFRESH_SECS)]
    pub refresh_secs: u64,
}

impl DiscoveryArgs {
    /// Before any channel is built.
    pub fn install(&self) -> Result<(), String> {
        if !(1..=3600).contains(&self.refresh_secs) {
            return Err(
                "--discovery-refresh-secs (FORKYARD_DISCOVERY_REFRESH_SECS) must be 1 to 3600"
                    .into(),
            );
        }
        REFRESH_SECS.store(self.refresh_secs, Ordering::Relaxed);
        Ok(())
    }
}

fn refresh() -> Duration {
    Duration::from_secs(REFRESH_SECS.load(Ordering::Relaxed))
}

/// How long one name's lookup may take before it counts as failed.
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(10);

/// Each balanced channel's setting and whether its names have resolved to a replica yet.
static PEERS: Mutex<Vec<(String, Arc<AtomicBool>)>> = Mutex::new(Vec::new());

/// The settings whose peer names have not resolved to any replica yet (a name that does
/// not resolve, or a peer that is not up), each with the addresses it names (`--x-addr
/// (FORKYARD_X_ADDR) = http://name:port`): the service reports NOT_SERVING meanwhile
/// (`crate::service`), and keeps looking them up.
pub fn waiting_for() -> Vec<String> {
    let peers = PEERS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut out: Vec<String> = peers
        .iter()
        .filter(|(_, resolved)| !resolved.load(Ordering::Relaxed))
        .map(|(setting, _)| setting.clone())
        .collect();
    out.dedup();
    out
}

fn register(setting: &str, addrs: &str) -> Arc<AtomicBool> {
    let resolved = Arc::new(AtomicBool::new(false));
    PEERS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .push((format!("{setting} = {}", addrs.trim()), resolved.clone()));
    resolved
}

/// One peer address as configured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    url: String,
    scheme: String,
    host: String,
    port: u16,
}

/// One replica of a target: where to dial it and the name its certificate carries.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Replica {
    pub url: String,
    pub tls_name: String,
}

impl Target {
    fn ip(&self) -> Option<IpAddr> {
        self.host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse()
            .ok()
    }

    /// The configured address, e.g. for log lines.
    pub fn url(&self) -> &str {
        &self.url
    }

    fn replica(&self, addr: SocketAddr) -> Replica {
        Replica {
            url: format!("{}://{addr}", self.scheme),
            tls_name: self.host.clone(),
        }
    }

    /// Every replica the name resolves to now (an IP literal: itself).
    pub async fn resolve(&self) -> Result<Vec<Replica>, String> {
        if self.ip().is_some() {
            return Ok(vec![Replica {
                url: self.url.clone(),
                tls_name: self.host.clone(),
            }]);
        }
        // A resolver that never answers (an unreachable nameserver, retried per search
        // domain) must not hold the refresh loop, nor hide the name from the log.
        let lookup = tokio::net::lookup_host((self.host.as_str(), self.port));
        let addrs = tokio::time::timeout(LOOKUP_TIMEOUT, lookup)
            .await
            .map_err(|_| {
                format!(
                    "cannot resolve {}: no answer within {}s",
                    self.host,
                    LOOKUP_TIMEOUT.as_secs()
                )
            })?
            .map_err(|e| format!("cannot resolve {}: {e}", self.host))?;
        let set: BTreeSet<SocketAddr> = addrs.collect();
        Ok(set.into_iter().map(|a| self.replica(a)).collect())
    }
}

/// `addrs` (comma-separated http(s) URLs) as targets; `flag` names the setting in errors.
pub fn parse(flag: &str, addrs: &str) -> Result<Vec<Target>, String> {
    let mut out = Vec::new();
    for a in addrs.split(',').map(str::trim).filter(|a| !a.is_empty()) {
        let uri: http::Uri = a
            .parse()
            .map_err(|e| format!("{flag} {a:?} is not a URL: {e}"))?;
        let scheme = uri.scheme_str().unwrap_or_default();
        if scheme != "http" && scheme != "https" {
            return Err(format!("{flag} {a:?} is not an http:// or https:// URL"));
        }
        let host = uri.host().unwrap_or_default();
        if host.is_empty() {
            return Err(format!("{flag} {a:?} names no host"));
        }
        let port = uri
            .port_u16()
            .unwrap_or(if scheme == "https" { 443 } else { 80 });
        out.push(Target {
            url: a.trim_end_matches('/').to_owned(),
            scheme: scheme.to_owned(),
            host: host.to_owned(),
            port,
        });
    }
    if out.is_empty() {
        return Err(format!("{flag} names no address"));
    }
    Ok(out)
}

/// Every replica of every target now, deduplicated (a lookup that fails is an error
/// naming the name: the caller decides whether the others are enough).
pub async fn replicas(targets: &[Target]) -> (Vec<Replica>, Vec<String>) {
    let mut all: BTreeMap<String, Replica> = BTreeMap::new();
    let mut errors = Vec::new();
    for t in targets {
        match t.resolve().await {
            Ok(found) => {
                for r in found {
                    all.entry(r.url.clone()).or_insert(r);
                }
            }
            Err(e) => errors.push(e),
        }
    }
    (all.into_values().collect(), errors)
}

/// The endpoint for one replica: the mesh TLS checks the certificate against the
/// configured name.
pub fn endpoint(replica: &Replica) -> Result<Endpoint, String> {
    crate::tls::endpoint_named(&replica.url, &replica.tls_name)
}

/// One channel over every replica of `addrs`, following their names; `configure` sets
/// timeouts on each replica's endpoint. Names are looked up on a task of the current
/// Tokio runtime; a single IP literal is a plain lazily connected channel.
pub fn balanced(
    flag: &str,
    addrs: &str,
    configure: impl Fn(Endpoint) -> Endpoint + Send + Sync + 'static,
) -> Result<Balanced, String> {
    let targets = parse(flag, addrs)?;
    if let [one] = targets.as_slice()
        && one.ip().is_some()
    {
        return Ok(configure(crate::tls::endpoint(&one.url)?)
            .connect_lazy()
            .into());
    }
    // Check every address builds an endpoint now, so a bad one is a config error.
    for t in &targets {
        crate::tls::endpoint(&t.url).map_err(|e| format!("{flag}: {e}"))?;
    }
    let channel = Balanced::empty(flag);
    let resolved = register(flag, addrs);
    let flag = flag.to_owned();
    let members = channel.downgrade();
    tokio::spawn(async move {
        let mut current: BTreeMap<String, Channel> = BTreeMap::new();
        let mut failing = false;
        loop {
            let (now, errors) = replicas(&targets).await;
            if !errors.is_empty() && !failing {
                tracing::warn!(setting = %flag, errors = ?errors, "peer lookup failed; keeping the replicas known so far and retrying");
            }
            if errors.is_empty() && !now.is_empty() {
                resolved.store(true, Ordering::Relaxed);
            }
            failing = !errors.is_empty();
            // A failed lookup keeps what that name had (DNS hiccups must not empty the
            // channel); replicas of names that answered are replaced.
            let next = next_replicas(&flag, &current, &now, !errors.is_empty(), &configure);
            let Some(members) = members.upgrade() else {
                return; // every user of the channel is gone
            };
            if next.keys().ne(current.keys()) {
                members.set(next.iter().map(|(u, c)| (u.clone(), c.clone())).collect());
            }
            drop(members);
            current = next;
            tokio::time::sleep(refresh()).await;
        }
    });
    Ok(channel)
}

/// The channels after a lookup found `now`: a known replica keeps its channel, a new
/// one gets one, the rest are dropped, unless `keep_old` (a lookup failed).
fn next_replicas(
    flag: &str,
    current: &BTreeMap<String, Channel>,
    now: &[Replica],
    keep_old: bool,
    configure: &impl Fn(Endpoint) -> Endpoint,
) -> BTreeMap<String, Channel> {
    let mut next = if keep_old {
        current.clone()
    } else {
        BTreeMap::new()
    };
    for replica in now {
        if let Some(ch) = current.get(&replica.url) {
            next.insert(replica.url.clone(), ch.clone());
            continue;
        }
        match endpoint(replica) {
            Ok(ep) => {
                tracing::info!(setting = %flag, replica = %replica.url, "peer replica added");
                next.insert(replica.url.clone(), configure(ep).connect_lazy());
            }
            Err(e) => {
                tracing::warn!(setting = %flag, replica = %replica.url, error = %e, "peer replica skipped");
            }
        }
    }
    for url in current.keys().filter(|u| !next.contains_key(*u)) {
        tracing::info!(setting = %flag, replica = %url, "peer replica removed");
    }
    next
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_parse_with_the_setting_named_in_errors() {
        let t = parse("--x (X)", "http://a:1, https://10.0.0.1:2/").unwrap();
        assert_eq!(t.len(), 2);
        assert_eq!((t[0].host.as_str(), t[0].port), ("a", 1));
        assert!(t[1].ip().is_some());
        assert_eq!(t[1].url(), "https://10.0.0.1:2");
        for bad in ["", " , ", "ftp://a:1", "not a url", "http://:1"] {
            let e = parse("--x (X)", bad).unwrap_err();
            assert!(e.contains("--x (X)"), "{bad:?}: {e}");
        }
    }

    #[tokio::test]
    async fn a_name_resolves_to_every_address_and_a_literal_to_itself() {
        let t = parse("f", "http://localhost:7,http://127.0.0.1:7,http://[::1]:8").unwrap();
        let (all, errors) = replicas(&t).await;
        assert!(errors.is_empty(), "{errors:?}");
        let urls: Vec<&str> = all.iter().map(|r| r.url.as_str()).collect();
        assert!(urls.contains(&"http://127.0.0.1:7"), "{urls:?}");
        assert!(urls.contains(&"http://[::1]:8"), "{urls:?}");
        // localhost and 127.0.0.1 are the same replica once.
        assert_eq!(
            urls.iter().filter(|u| **u == "http://127.0.0.1:7").count(),
            1
        );
        let named = all.iter().find(|r| r.tls_name == "localhost");
        assert!(
            named.is_some(),
            "a replica found by name keeps the name for TLS"
        );
    }

    #[tokio::test]
    async fn an_unknown_name_is_an_error_naming_it() {
        let t = parse("f", "http://no-such-peer.invalid:1").unwrap();
        let (all, errors) = replicas(&t).await;
        assert!(all.is_empty());
        assert!(errors[0].contains("no-such-peer.invalid"), "{errors:?}");
    }
}
