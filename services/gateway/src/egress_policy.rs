//! Which hosts a run's sandboxes may reach besides the LLM gateway (`LaunchRunRequest.
//! egress`): host patterns and sets the operator names (`npm`, `pypi`, `crates`,
//! `debian`, `github`), bounded per tenant. The provisioner's egress proxy enforces the
//! list this makes; this is where a tenant learns it asked for too much.

use crate::error::GatewayError;
use forkyard_common::hosts;
use std::collections::BTreeMap;

pub const SETS_SETTING: &str = "--egress-sets (FORKYARD_EGRESS_SETS)";
pub const TENANT_SETTING: &str = "--tenant-egress (FORKYARD_TENANT_EGRESS)";
/// Most entries one run may ask for.
const MAX_ENTRIES: usize = 64;

/// The sets every gateway knows; `--egress-sets` adds to and replaces them.
fn builtin_sets() -> BTreeMap<String, Vec<String>> {
    [
        ("npm", &["registry.npmjs.org"][..]),
        ("pypi", &["pypi.org", "files.pythonhosted.org"][..]),
        (
            "crates",
            &["crates.io", "index.crates.io", "static.crates.io"][..],
        ),
        ("debian", &["deb.debian.org", "security.debian.org"][..]),
        (
            "github",
            &[
                "github.com",
                "codeload.github.com",
                "objects.githubusercontent.com",
                "raw.githubusercontent.com",
            ][..],
        ),
    ]
    .iter()
    .map(|(n, hosts)| {
        (
            (*n).to_owned(),
            hosts.iter().map(|h| (*h).to_owned()).collect(),
        )
    })
    .collect()
}

#[derive(Debug, Clone)]
pub struct EgressPolicy {
    sets: BTreeMap<String, Vec<String>>,
    /// Per tenant (`*`: every tenant not named) the entries it may ask for: hosts,
    /// `*.domain`, set names, or `*` for any public host.
    tenants: BTreeMap<String, Vec<String>>,
}

impl Default for EgressPolicy {
    /// Any public host for every tenant (authentication off, the local stack).
    fn default() -> Self {
        Self {
            sets: builtin_sets(),
            tenants: BTreeMap::from([("*".to_owned(), vec!["*".to_owned()])]),
        }
    }
}

/// `name=a,b;name2=c` (whitespace ignored).
pub(crate) fn parse_map(
    setting: &str,
    text: &str,
) -> Result<BTreeMap<String, Vec<String>>, String> {
    let mut out = BTreeMap::new();
    for part in text.split(';').map(str::trim).filter(|p| !p.is_empty()) {
        let (name, list) = part
            .split_once('=')
            .ok_or_else(|| format!("{setting}: {part:?} is not name=entry,entry"))?;
        let entries: Vec<String> = list
            .split(',')
            .map(|e| e.trim().to_ascii_lowercase())
            .filter(|e| !e.is_empty())
            .collect();
        out.insert(name.trim().to_owned(), entries);
    }
    Ok(out)
}

/// A host pattern as the provisioner's proxy reads it: `host`, `host:port`, `*.domain`.
fn pattern_ok(e: &str) -> bool {
    !e.is_empty()
        && e.len() <= 253
        && e.chars()
            .all(|c| c.is_ascii_alphanumeric() || ".-:*_[]".contains(c))
        && (!e.contains('*') || (e.starts_with("*.") && !e[1..].contains('*') && e.len() > 2))
}

/// Loopback, link-local, private or unspecified: the host's own services and the mesh.
fn special_address(host: &str) -> bool {
    hosts::is_localhost(host) || host.parse().is_ok_and(hosts::internal)
}

impl EgressPolicy {
    /// From the settings: unset sets are the built-in ones; unset tenants are any public
    /// host with authentication off, and the built-in sets only with API keys.
    pub fn from_settings(
        sets: Option<&str>,
        tenants: Option<&str>,
        authenticated: bool,
    ) -> Result<Self, String> {
        let mut all = builtin_sets();
        if let Some(text) = sets {
            for (name, hosts) in parse_map(SETS_SETTING, text)? {
                if let Some(bad) = hosts.iter().find(|h| !pattern_ok(h)) {
                    return Err(format!(
                        "{SETS_SETTING}: set {name}: {bad:?} is not a host, host:port or *.domain"
                    ));
                }
                all.insert(name, hosts);
            }
        }
        let tenants = match tenants {
            Some(text) => parse_map(TENANT_SETTING, text)?,
            None if authenticated => {
                BTreeMap::from([("*".to_owned(), builtin_sets().into_keys().collect())])
            }
            None => BTreeMap::from([("*".to_owned(), vec!["*".to_owned()])]),
        };
        for (tenant, entries) in &tenants {
            if let Some(bad) = entries
                .iter()
                .find(|e| *e != "*" && !all.contains_key(*e) && !pattern_ok(e))
            {
                return Err(format!(
                    "{TENANT_SETTING}: tenant {tenant}: {bad:?} is not a host pattern or a set name"
                ));
            }
        }
        Ok(Self { sets: all, tenants })
    }

    fn entries_of(&self, tenant: &str) -> &[String] {
        self.tenants
            .get(tenant)
            .or_else(|| self.tenants.get("*"))
            .map_or(&[], Vec::as_slice)
    }

    /// Whether `tenant`'s policy covers host pattern `want`.
    fn covers(&self, tenant: &str, want: &str) -> bool {
        let host = hosts::host_part(want);
        self.entries_of(tenant).iter().any(|p| {
            if p == want {
                return true;
            }
            if p == "*" {
                return !special_address(host);
            }
            let hosts = self
                .sets
                .get(p)
                .map_or_else(|| vec![p.clone()], Clone::clone);
            hosts.iter().any(|h| {
                h == want
                    || h.strip_prefix("*.").is_some_and(|d| {
                        let tail = want.strip_prefix("*.").unwrap_or(host);
                        tail == d || tail.ends_with(&format!(".{d}"))
                    })
            })
        })
    }

    /// The hosts `tenant`'s run asked for (sets expanded), or why not: a malformed
    /// entry is INVALID_ARGUMENT, one beyond the tenant's policy PERMISSION_DENIED.
    pub fn check(&self, tenant: &str, asked: &[String]) -> Result<Vec<String>, GatewayError> {
        if asked.len() > MAX_ENTRIES {
            return Err(GatewayError::field(
                "egress",
                format!("{} entries; the limit is {MAX_ENTRIES}", asked.len()),
            ));
        }
        let mut out: Vec<String> = Vec::new();
        for raw in asked {
            let e = raw.trim().to_ascii_lowercase();
            let hosts = match self.sets.get(&e) {
                Some(hosts) => {
                    if !self.entries_of(tenant).iter().any(|p| p == "*" || *p == e)
                        && !hosts.iter().all(|h| self.covers(tenant, h))
                    {
                        return Err(denied(tenant, &e));
                    }
                    hosts.clone()
                }
                None => {
                    if !pattern_ok(&e) {
                        return Err(GatewayError::field(
                            "egress",
                            format!(
                                "{raw:?} is neither a host, host:port or *.domain nor a set ({})",
                                self.set_names()
                            ),
                        ));
                    }
                    if special_address(hosts::host_part(&e))
                        && !self.entries_of(tenant).contains(&e)
                    {
                        return Err(GatewayError::field(
                            "egress",
                            format!(
                                "{e} is a loopback, link-local or private address: a sandbox must not reach the host's or the mesh's own services (the operator can list it in {TENANT_SETTING})"
                            ),
                        ));
                    }
                    if !self.covers(tenant, &e) {
                        return Err(denied(tenant, &e));
                    }
                    vec![e]
                }
            };
            for h in hosts {
                if !out.contains(&h) {
                    out.push(h);
                }
            }
        }
        Ok(out)
    }

    fn set_names(&self) -> String {
        self.sets.keys().cloned().collect::<Vec<_>>().join(", ")
    }
}

fn denied(tenant: &str, entry: &str) -> GatewayError {
    GatewayError::PermissionDenied(format!(
        "egress: {entry} is outside tenant {tenant}'s egress policy ({TENANT_SETTING})"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::Code;

    fn code(r: Result<Vec<String>, GatewayError>) -> Code {
        tonic::Status::from(r.unwrap_err()).code()
    }

    fn asked(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn sets_expand_and_the_tenant_policy_bounds_them() {
        let p = EgressPolicy::from_settings(
            Some("internal=git.corp.example"),
            Some("*=npm,crates;team-a=*,10.0.0.7"),
            true,
        )
        .unwrap();
        assert_eq!(
            p.check("team-b", &asked(&["npm", "crates.io"])).unwrap(),
            ["registry.npmjs.org", "crates.io"]
        );
        let err = p.check("team-b", &asked(&["pypi"])).unwrap_err();
        assert!(
            err.to_string().contains("pypi") && err.to_string().contains("team-b"),
            "{err}"
        );
        assert_eq!(
            code(p.check("team-b", &asked(&["pypi"]))),
            Code::PermissionDenied
        );
        assert_eq!(
            code(p.check("team-b", &asked(&["evil.example"]))),
            Code::PermissionDenied
        );
        assert_eq!(
            p.check("team-a", &asked(&["internal", "*.example.org"]))
                .unwrap(),
            ["git.corp.example", "*.example.org"]
        );
        // Only what the operator listed literally reaches a private address.
        assert_eq!(
            p.check("team-a", &asked(&["10.0.0.7"])).unwrap(),
            ["10.0.0.7"]
        );
        assert_eq!(
            code(p.check("team-a", &asked(&["10.0.0.8"]))),
            Code::InvalidArgument
        );
    }

    #[test]
    fn loopback_link_local_and_junk_are_invalid_whatever_the_policy() {
        let p = EgressPolicy::default();
        for bad in [
            "127.0.0.1",
            "127.0.0.1:7233",
            "localhost",
            "api.localhost",
            "169.254.169.254",
            "[::1]:7233",
            "[fe80::1]",
            "0.0.0.0",
            "192.168.1.1",
            // Blocks hosts::internal missed before (issue 41): CGNAT (one cloud's
            // metadata service), this network, benchmarking, multicast, reserved,
            // NAT64 and 6to4 of private addresses, site-local, IPv4-mapped.
            "100.100.100.200",
            "0.0.0.1:80",
            "198.18.0.1",
            "224.0.0.251",
            "240.0.0.1",
            "[64:ff9b::a9fe:a9fe]",
            "[2002:c0a8:101::1]:80",
            "[fec0::1]",
            "[::ffff:1.1.1.1]",
        ] {
            assert_eq!(
                code(p.check("default", &asked(&[bad]))),
                Code::InvalidArgument,
                "{bad}"
            );
        }
        for junk in ["", "a b", "ho*st", "*", "http://x.com"] {
            assert_eq!(
                code(p.check("default", &asked(&[junk]))),
                Code::InvalidArgument,
                "{junk:?}"
            );
        }
        assert_eq!(
            p.check("default", &asked(&["example.com:443", "*.github.com"]))
                .unwrap(),
            ["example.com:443", "*.github.com"]
        );
    }

    #[test]
    fn settings_are_checked() {
        assert!(EgressPolicy::from_settings(Some("x"), None, false).is_err());
        assert!(EgressPolicy::from_settings(None, Some("*=nosuchset!"), false).is_err());
        let keys = EgressPolicy::from_settings(None, None, true).unwrap();
        assert!(keys.check("t", &asked(&["npm"])).is_ok());
        assert_eq!(
            code(keys.check("t", &asked(&["example.com"]))),
            Code::PermissionDenied
        );
    }
}
