//! The fake's check of a create's network rules, as E2B's API makes it (e2b-dev/infra:
//! `NewSandbox.network` is `SandboxNetworkConfig` in `spec/openapi.yml`, checked by
//! `validateEgressRules` and `ParseRule`): entries `host[:port|:lo-hi]`, `denyOut` of
//! IPs and CIDRs only, domains in `allowOut` only with `0.0.0.0/0` denied. A field of
//! the wrong type is a 400 there too (the JSON cannot be bound). Stricter than E2B on
//! purpose: a key the schema does not name is refused, where E2B's decoder would drop
//! it silently, so a misspelt rule (`allow_out`) fails the test instead of leaving the
//! sandbox open.

use serde_json::Value;

const KEYS: [&str; 4] = [
    "allowPublicTraffic",
    "allowOut",
    "denyOut",
    "maskRequestHost",
];

/// `Ok(network)` as recorded, or the 400 message E2B would answer.
pub(crate) fn check(body: &Value) -> Result<Option<Value>, String> {
    if let Some(v) = body.get("allow_internet_access")
        && !v.is_boolean()
    {
        return Err("allow_internet_access must be a boolean".into());
    }
    let Some(n) = body.get("network") else {
        return Ok(None);
    };
    let obj = n.as_object().ok_or("network must be an object")?;
    if let Some(k) = obj.keys().find(|k| !KEYS.contains(&k.as_str())) {
        return Err(format!("network: unknown field {k:?}"));
    }
    let list = |k: &str| -> Result<Vec<String>, String> {
        match obj.get(k) {
            None | Some(Value::Null) => Ok(Vec::new()),
            Some(Value::Array(a)) => a
                .iter()
                .map(|v| v.as_str().map(str::to_owned))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| format!("network.{k} must be an array of strings")),
            Some(_) => Err(format!("network.{k} must be an array of strings")),
        }
    };
    let (allow, deny) = (list("allowOut")?, list("denyOut")?);
    let mut deny_all = false;
    for d in &deny {
        let (host, ports) = rule(d).map_err(|e| format!("invalid deny out entry: {e}"))?;
        if !ip_or_cidr(host) {
            return Err(format!("invalid denied CIDR {host}"));
        }
        deny_all |= host == "0.0.0.0/0" && ports.is_none();
    }
    let mut domains = false;
    for a in &allow {
        let (host, _) = rule(a).map_err(|e| format!("invalid allow out entry: {e}"))?;
        domains |= !ip_or_cidr(host);
    }
    if domains && !deny_all {
        return Err("When specifying domains in allowOut, you must include '0.0.0.0/0' in denyOut to block all other traffic.".into());
    }
    Ok(Some(n.clone()))
}

fn ip_or_cidr(h: &str) -> bool {
    if h.parse::<std::net::IpAddr>().is_ok() {
        return true;
    }
    h.split_once('/').is_some_and(|(ip, len)| {
        let max = match ip.parse::<std::net::IpAddr>() {
            Ok(std::net::IpAddr::V4(_)) => 32,
            Ok(std::net::IpAddr::V6(_)) => 128,
            Err(_) => return false,
        };
        len.parse::<u8>().is_ok_and(|l| l <= max)
    })
}

/// A rule's ports, first to last; `None`: all.
type Ports = Option<(u16, u16)>;

/// `ParseRule`: (host, port range); `[v6]:port` in brackets, a bare v6 with no port.
fn rule(s: &str) -> Result<(&str, Ports), String> {
    let s = s.trim();
    if s.is_empty() {
        return Err("empty network rule".into());
    }
    let (host, ports) = if let Some(rest) = s.strip_prefix('[') {
        let (h, after) = rest.split_once(']').ok_or("missing closing bracket")?;
        match after {
            "" => (h, ""),
            a => (h, a.strip_prefix(':').ok_or("expected ':' after ']'")?),
        }
    } else if s.matches(':').count() > 1 {
        (s, "")
    } else {
        s.rsplit_once(':').unwrap_or((s, ""))
    };
    if ports.is_empty() {
        return Ok((host, None));
    }
    let port = |p: &str| match p.parse::<u16>() {
        Ok(0) | Err(_) => Err(format!("invalid port {p:?}")),
        Ok(n) => Ok(n),
    };
    let (lo, hi) = match ports.split_once('-') {
        Some((a, b)) => (port(a)?, port(b)?),
        None => (port(ports)?, port(ports)?),
    };
    if lo > hi {
        return Err(format!("port range start {lo} is greater than end {hi}"));
    }
    Ok((host, Some((lo, hi))))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn rules_are_checked_as_e2b_checks_them() {
        let ok = json!({"network": {"denyOut": ["0.0.0.0/0"], "allowOut": ["pypi.org", "*.x.org:443", "1.1.1.1", "8.8.8.0/24:1-1024"]}});
        assert!(check(&ok).unwrap().is_some());
        assert_eq!(check(&json!({"templateID": "base"})), Ok(None));
        for bad in [
            json!({"network": {"allowOut": ["pypi.org"]}}),
            json!({"network": {"denyOut": ["example.com"]}}),
            json!({"network": {"allow_out": ["1.1.1.1"]}}),
            json!({"network": {"allowOut": "1.1.1.1"}}),
            json!({"network": {"allowOut": ["1.1.1.1:0"]}}),
            json!({"network": {"allowOut": [""]}}),
            json!({"network": {"denyOut": ["0.0.0.0/0:80"], "allowOut": ["x.com"]}}),
            json!({"network": []}),
            json!({"allow_internet_access": "no"}),
        ] {
            assert!(check(&bad).is_err(), "{bad}");
        }
    }
}
