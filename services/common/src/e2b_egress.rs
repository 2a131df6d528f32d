//! A run's egress allowlist as E2B's own sandbox network rules: one mapping for the
//! gateway (what cannot be expressed is refused at launch naming `egress`) and the
//! provisioner's e2b backend (what it sends at create).
//!
//! E2B's REST API takes the rules in `POST /sandboxes`, field `network` (schema
//! `SandboxNetworkConfig`: `allowOut`, `denyOut`, `allowPublicTraffic`,
//! `maskRequestHost`), in e2b-dev/infra `spec/openapi.yml`; its checks are
//! `validateEgressRules` in `packages/api/internal/handlers/sandbox_network_update.go`
//! and `ParseRule` in `packages/shared/pkg/sandbox-network/rule.go`:
//! - an entry is `host`, `host:port` or `host:lo-hi`, the host an IP, a CIDR or a
//!   domain name (`example.com`, `*.example.com`: the docs' "Internet access" page);
//! - `denyOut` takes IPs and CIDRs only; `allowOut` wins over `denyOut`;
//! - `allowOut` with a domain requires `0.0.0.0/0` in `denyOut`;
//! - sandboxes never reach private, loopback or link-local ranges whatever the rules
//!   (`DeniedSandboxCIDRs` in `firewall.go`), and its firewall sets are IPv4.
//!
//! So an allowlist becomes `denyOut: ["0.0.0.0/0"]` (deny by default, with or without
//! an allowlist, as a local sandbox) and one `allowOut` entry per host pattern, spelled as the local egress proxy reads it (the
//! same `host[:port]` and `*.domain[:port]` forms). What E2B cannot express is refused
//! rather than sent as a rule that means something else: an IPv6 address (its rules are
//! IPv4; a `0.0.0.0/0` deny does not cover IPv6 either, so an allowed IPv6 entry would
//! promise what the sandbox cannot use), and an internal address (loopback, private,
//! link-local…) or `localhost`, which E2B never lets a sandbox reach.

use crate::{allowed_hosts, hosts};
use std::net::IpAddr;

/// Everything else: the rule E2B needs before domain entries count.
pub const DENY_ALL: &str = "0.0.0.0/0";

/// The E2B `allowOut` entry for one egress allowlist entry, or why it has none.
pub fn allow_out(entry: &str) -> Result<String, String> {
    let e = entry.trim().to_ascii_lowercase();
    let (host, port) = allowed_hosts::split_host_port(&e)?;
    let (name, wildcard) = match host.strip_prefix("*.") {
        Some(domain) => (domain, true),
        None => (host, false),
    };
    if !allowed_hosts::valid_host(name) {
        return Err(format!("{entry:?} is not a host, host:port or *.domain"));
    }
    if let Ok(ip) = name.parse::<IpAddr>() {
        if wildcard {
            return Err(format!("{entry:?}: a wildcard of an address"));
        }
        if ip.is_ipv6() {
            return Err(format!(
                "{entry:?}: E2B's network rules take IPv4 addresses only"
            ));
        }
        if hosts::internal(ip) {
            return Err(format!(
                "{entry:?}: E2B never lets a sandbox reach loopback, link-local or private addresses"
            ));
        }
    } else if hosts::is_localhost(name) {
        return Err(format!(
            "{entry:?}: an E2B sandbox has no localhost to reach"
        ));
    }
    let host = if wildcard {
        format!("*.{name}")
    } else {
        name.to_owned()
    };
    Ok(match port {
        Some(p) => format!("{host}:{p}"),
        None => host,
    })
}

/// The `network` E2B's create takes for `allowlist` plus `always` (entries already
/// spelled as E2B takes them: the metering LLM gateway's address). Everything else is
/// denied, with an allowlist or without one: a local sandbox without an allowlist
/// reaches nothing but the LLM relay, and an E2B sandbox is held to the same (E2B's own
/// default is the open internet). Its repository comes as a bundle, so it needs no
/// network for that.
pub fn network(allowlist: &[String], always: &[String]) -> Result<serde_json::Value, String> {
    let mut allow: Vec<String> = Vec::new();
    for e in allowlist {
        let rule = allow_out(e)?;
        if !allow.contains(&rule) {
            allow.push(rule);
        }
    }
    for a in always {
        if !allow.contains(a) {
            allow.push(a.clone());
        }
    }
    if allow.is_empty() {
        return Ok(serde_json::json!({ "denyOut": [DENY_ALL] }));
    }
    Ok(serde_json::json!({
        "denyOut": [DENY_ALL],
        "allowOut": allow,
    }))
}

/// The `allowOut` entry that lets a sandbox reach `url` (`http(s)://host[:port]/…`):
/// its host and the port the URL reaches. Not checked against internal addresses: the
/// operator names it (a test's loopback gateway among them).
pub fn url_rule(url: &str) -> Result<String, String> {
    let u = url::Url::parse(url.trim()).map_err(|e| format!("{url:?}: {e}"))?;
    let host = u
        .host_str()
        .ok_or_else(|| format!("{url:?}: no host"))?
        .trim_start_matches('[')
        .trim_end_matches(']');
    if host.parse::<std::net::Ipv6Addr>().is_ok() {
        return Err(format!(
            "{url:?}: E2B's network rules take IPv4 addresses only"
        ));
    }
    let port = u
        .port_or_known_default()
        .ok_or_else(|| format!("{url:?}: no port"))?;
    Ok(format!("{host}:{port}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_map_to_e2b_rules_or_are_refused_naming_why() {
        for (entry, rule) in [
            ("pypi.org", "pypi.org"),
            ("Example.COM:443", "example.com:443"),
            ("*.github.com", "*.github.com"),
            ("*.github.com:443", "*.github.com:443"),
            ("1.1.1.1", "1.1.1.1"),
            ("8.8.8.8:53", "8.8.8.8:53"),
        ] {
            assert_eq!(allow_out(entry).as_deref(), Ok(rule), "{entry}");
        }
        for (entry, why) in [
            ("[2606:4700::1111]", "IPv4"),
            ("[2606:4700::1111]:443", "IPv4"),
            ("10.0.0.7", "private"),
            ("127.0.0.1:7233", "private"),
            ("169.254.169.254", "private"),
            ("localhost", "localhost"),
            ("*.1.2.3.4", "wildcard"),
            ("a b", "not a host"),
            ("x.com:0", "port"),
        ] {
            let e = allow_out(entry).unwrap_err();
            assert!(e.contains(why), "{entry}: {e}");
        }
    }

    #[test]
    fn an_allowlist_denies_the_rest_and_keeps_the_llm_gateway() {
        // Without an allowlist: the LLM gateway only, or nothing at all.
        assert_eq!(
            network(&[], &["llm.example:443".into()]),
            Ok(serde_json::json!({"denyOut": ["0.0.0.0/0"], "allowOut": ["llm.example:443"]}))
        );
        assert_eq!(
            network(&[], &[]),
            Ok(serde_json::json!({"denyOut": ["0.0.0.0/0"]}))
        );
        let n = network(
            &[
                "pypi.org".into(),
                "PYPI.org".into(),
                "*.npmjs.org:443".into(),
            ],
            &["llm.example:443".into()],
        )
        .unwrap();
        assert_eq!(
            n,
            serde_json::json!({
                "denyOut": ["0.0.0.0/0"],
                "allowOut": ["pypi.org", "*.npmjs.org:443", "llm.example:443"],
            })
        );
        assert!(network(&["10.1.2.3".into()], &[]).is_err());
        assert_eq!(
            url_rule("https://llm.example/v1").as_deref(),
            Ok("llm.example:443")
        );
        assert_eq!(
            url_rule("http://127.0.0.1:4000").as_deref(),
            Ok("127.0.0.1:4000")
        );
        assert!(url_rule("http://[::1]:4000").is_err());
        assert!(url_rule("not a url").is_err());
    }
}
