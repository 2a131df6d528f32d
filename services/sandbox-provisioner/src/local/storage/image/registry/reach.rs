//! Which registries (and their auth services) a pull may reach, and the HTTP client
//! held to that: a create names the image, so without these a caller could make the
//! provisioner fetch from any host and port of its network, a metadata service included.
//!
//! - a registry's host must be admitted by `--allowed-registries` (empty: any);
//! - every address a host resolves to must be public unless an exact entry lists the
//!   host, checked by the client's own resolver, so the connection goes to the addresses
//!   checked (no second lookup a rebinding DNS could answer differently); an IP literal
//!   is checked before the request, and so is every redirect's target;
//! - a bearer challenge's realm must be on the registry's own host and port, or an https
//!   host of the registry's own domain (Docker Hub's `auth.docker.io` for
//!   `registry-1.docker.io`), or be admitted by a non-empty `--allowed-registries`: a
//!   registry cannot send the provisioner, with the operator's credentials, elsewhere;
//! - no proxy from the environment: it would resolve the names itself.

use crate::local::storage::image::error::ImageError;
use forkyard_common::allowed_hosts::{AllowedHosts, normal_host};
use std::{net::SocketAddr, sync::Arc, time::Duration};

/// The client every pull of this provisioner uses.
pub(super) fn client(allowed: &AllowedHosts) -> Result<reqwest::Client, String> {
    let allowed = Arc::new(allowed.clone());
    let on_redirect = allowed.clone();
    reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(10))
        .read_timeout(Duration::from_secs(60))
        .user_agent("forkyard-sandbox-provisioner")
        .no_proxy()
        .dns_resolver(Arc::new(CheckedResolver(allowed)))
        .redirect(reqwest::redirect::Policy::custom(move |attempt| {
            // Registries send blobs to their storage (S3, a CDN): any public host, but
            // never an address the pull could not have named.
            if attempt.previous().len() >= 10 {
                return attempt.error("too many redirects");
            }
            match redirect_allowed(&on_redirect, attempt.url()) {
                Ok(()) => attempt.follow(),
                Err(why) => attempt.error(why),
            }
        }))
        .build()
        .map_err(|e| e.to_string())
}

/// The client's resolver: the system's answer, refused when an address is not public
/// and the name is not listed exactly.
struct CheckedResolver(Arc<AllowedHosts>);

impl reqwest::dns::Resolve for CheckedResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let allowed = self.0.clone();
        Box::pin(async move {
            let host = name.as_str().to_owned();
            // The port is the connector's to set; 0 here.
            let addrs: Vec<SocketAddr> =
                tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            allowed.check_addrs(&host, None, addrs.iter().map(SocketAddr::ip))?;
            let addrs: reqwest::dns::Addrs = Box::new(addrs.into_iter());
            Ok(addrs)
        })
    }
}

/// A URL's host (normalised, without brackets) and port.
fn host_port(url: &reqwest::Url) -> Option<(String, u16)> {
    Some((normal_host(url.host_str()?), url.port_or_known_default()?))
}

/// What the resolver cannot see: an IP literal is connected to as it is.
fn literal_allowed(allowed: &AllowedHosts, host: &str, port: u16) -> Result<(), String> {
    match host.parse::<std::net::IpAddr>() {
        Ok(ip) => allowed
            .check_addrs(host, Some(port), [ip])
            .map_err(|r| r.to_string()),
        Err(_) => Ok(()),
    }
}

fn redirect_allowed(allowed: &AllowedHosts, url: &reqwest::Url) -> Result<(), String> {
    if !matches!(url.scheme(), "http" | "https") {
        return Err(format!("a redirect to a {} URL", url.scheme()));
    }
    let (host, port) = host_port(url).ok_or("a redirect to a URL without a host")?;
    // A name listed for another port only: the resolver would take its addresses.
    if allowed.lists(&host, None) && !allowed.lists(&host, Some(port)) {
        return Err(format!("a redirect to {host}:{port}, a port not listed"));
    }
    literal_allowed(allowed, &host, port)
}

/// A registry (`host` or `host:port` of an image reference, reached at `base`) a pull
/// may start from; `Err` is what the caller is told.
pub(super) fn check_registry(
    allowed: &AllowedHosts,
    registry: &str,
    base: &str,
) -> Result<(), ImageError> {
    let url = reqwest::Url::parse(base).map_err(|e| refused(registry, e))?;
    let (host, port) = host_port(&url).ok_or_else(|| refused(registry, "no host"))?;
    if !allowed.admits(&host, port) {
        return Err(ImageError::Refused(format!(
            "registry {registry} is not one this provisioner may pull from (the operator lists them in {})",
            allowed.setting()
        )));
    }
    literal_allowed(allowed, &host, port).map_err(|why| {
        tracing::warn!(registry, reason = %why, "registry refused");
        unreachable_registry(registry)
    })
}

/// A bearer challenge's realm, for a registry reached at `base`: the URL to ask for a
/// token, or why not.
pub(super) fn check_realm(
    allowed: &AllowedHosts,
    registry: &str,
    base: &str,
    realm: &str,
) -> Result<reqwest::Url, ImageError> {
    let bad = |why: &str| {
        ImageError::Refused(format!(
            "registry {registry} names an auth service {why} (the operator may list its host in {})",
            allowed.setting()
        ))
    };
    let url = reqwest::Url::parse(realm).map_err(|_| bad("that is not a URL"))?;
    let own = reqwest::Url::parse(base).ok().and_then(|b| host_port(&b));
    let (host, port) = host_port(&url).ok_or_else(|| bad("without a host"))?;
    let https = url.scheme() == "https";
    if !(https || url.scheme() == "http") {
        return Err(bad("that is not an http(s) URL"));
    }
    let same = own.as_ref() == Some(&(host.clone(), port));
    // Another port of the registry's own host is another service, not its domain's.
    let sibling = https
        && own
            .as_ref()
            .is_some_and(|(own, _)| *own != host && same_domain(own, &host));
    let listed = !allowed.is_empty() && allowed.admits(&host, port);
    // A host listed exactly for other ports only: the resolver would let its (private)
    // addresses through on this one.
    let other_port = allowed.lists(&host, None) && !allowed.lists(&host, Some(port));
    if !(same || sibling || listed) || other_port {
        tracing::warn!(registry, realm = %url, "bearer realm on another host refused");
        return Err(bad(&format!("on another host ({host}:{port})")));
    }
    literal_allowed(allowed, &host, port).map_err(|why| {
        tracing::warn!(registry, realm = %url, reason = %why, "bearer realm refused");
        unreachable_registry(registry)
    })?;
    Ok(url)
}

/// `realm` is in the domain of `registry` (the registry's name less its first label, of
/// two labels or more): `auth.docker.io` for `registry-1.docker.io`, `gitlab.com` for
/// `registry.gitlab.com`. Names only; an address has no domain.
fn same_domain(registry: &str, realm: &str) -> bool {
    if registry.parse::<std::net::IpAddr>().is_ok() || realm.parse::<std::net::IpAddr>().is_ok() {
        return false;
    }
    let Some((_, domain)) = registry.split_once('.') else {
        return false;
    };
    domain.contains('.') && (realm == domain || realm.ends_with(&format!(".{domain}")))
}

fn refused(registry: &str, why: impl std::fmt::Display) -> ImageError {
    ImageError::Refused(format!("registry {registry}: {why}"))
}

/// The one answer for a registry that cannot be reached, whatever the reason (logged).
pub(super) fn unreachable_registry(registry: &str) -> ImageError {
    ImageError::Registry(format!("{registry} cannot be reached"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn realms_stay_on_the_registry_or_its_domain() {
        let any = AllowedHosts::any_public("FORKYARD_ALLOWED_REGISTRIES");
        let ok = |reg: &str, base: &str, realm: &str| check_realm(&any, reg, base, realm).is_ok();
        assert!(ok(
            "registry-1.docker.io",
            "https://registry-1.docker.io",
            "https://auth.docker.io/token"
        ));
        assert!(ok("ghcr.io", "https://ghcr.io", "https://ghcr.io/token"));
        assert!(ok(
            "registry.gitlab.com",
            "https://registry.gitlab.com",
            "https://gitlab.com/jwt/auth"
        ));
        // Another TLD's host, a plain-http sibling, another port of the same address.
        assert!(!ok("ghcr.io", "https://ghcr.io", "https://evil.io/token"));
        assert!(!ok(
            "registry-1.docker.io",
            "https://registry-1.docker.io",
            "http://auth.docker.io/token"
        ));
        assert!(!ok(
            "127.0.0.1:5000",
            "http://127.0.0.1:5000",
            "http://127.0.0.1:5001/token"
        ));
        assert!(!ok("r.example", "https://r.example", "file:///etc/passwd"));
        assert!(!ok(
            "r.corp.example",
            "https://r.corp.example",
            "https://r.corp.example:22/"
        ));
        // A sibling is no way onto another port of a host listed for one port only.
        let listed = AllowedHosts::parse(
            "FORKYARD_ALLOWED_REGISTRIES",
            &["r.corp.example".into(), "auth.corp.example:443".into()],
        )
        .unwrap();
        let realm = |r: &str| check_realm(&listed, "r.corp.example", "https://r.corp.example", r);
        assert!(realm("https://auth.corp.example/token").is_ok());
        assert!(realm("https://auth.corp.example:8443/token").is_err());
    }

    #[test]
    fn redirects_to_addresses_that_could_not_be_named_are_not_followed() {
        let listed = AllowedHosts::parse(
            "FORKYARD_ALLOWED_REGISTRIES",
            &["registry.corp:5000".into()],
        )
        .unwrap();
        let url = |u: &str| reqwest::Url::parse(u).unwrap();
        assert!(redirect_allowed(&listed, &url("https://cdn.example/blob")).is_ok());
        assert!(redirect_allowed(&listed, &url("http://169.254.169.254/latest")).is_err());
        assert!(redirect_allowed(&listed, &url("http://[::1]:7233/")).is_err());
        assert!(redirect_allowed(&listed, &url("http://registry.corp:22/")).is_err());
        assert!(redirect_allowed(&listed, &url("file:///etc/passwd")).is_err());
    }
}
