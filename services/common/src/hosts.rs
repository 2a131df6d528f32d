//! What an egress entry (`host`, `host:port`, `[v6]:port`, `*.domain`) names, and
//! whether that is the host's own or a private network: one rule for the gateway's
//! tenant policy and the provisioner's egress proxy.

use std::net::IpAddr;

/// The host part of an egress entry (a port and IPv6 brackets removed).
pub fn host_part(entry: &str) -> &str {
    let h = match entry.rsplit_once(':') {
        Some((h, p)) if (!h.contains(':') || h.ends_with(']')) && p.parse::<u16>().is_ok() => h,
        _ => entry,
    };
    h.trim_start_matches('[').trim_end_matches(']')
}

/// Loopback, link-local, private, unspecified or broadcast: the host's own services
/// and the mesh's, never a sandbox's by default.
pub fn internal(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            v4.is_loopback()
                || v4.is_private()
                || v4.is_link_local()
                || v4.is_unspecified()
                || v4.is_broadcast()
        }
        IpAddr::V6(v6) => {
            v6.is_loopback()
                || v6.is_unspecified()
                || (v6.segments()[0] & 0xfe00) == 0xfc00
                || (v6.segments()[0] & 0xffc0) == 0xfe80
                || v6
                    .to_ipv4_mapped()
                    .is_some_and(|v4| internal(IpAddr::V4(v4)))
        }
    }
}

/// A `localhost` name.
pub fn is_localhost(host: &str) -> bool {
    host == "localhost" || host.ends_with(".localhost")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_of_entries_and_internal_addresses() {
        assert_eq!(host_part("example.com:443"), "example.com");
        assert_eq!(host_part("[::1]:7233"), "::1");
        assert_eq!(host_part("[fe80::1]"), "fe80::1");
        assert_eq!(host_part("*.github.com"), "*.github.com");
        for ip in [
            "10.1.2.3",
            "127.0.0.1",
            "169.254.169.254",
            "0.0.0.0",
            "::1",
            "fe80::1",
            "::ffff:192.168.1.1",
        ] {
            assert!(internal(ip.parse().unwrap()), "{ip}");
        }
        assert!(!internal("1.1.1.1".parse().unwrap()));
        assert!(is_localhost("api.localhost") && !is_localhost("localhost.example"));
    }
}
