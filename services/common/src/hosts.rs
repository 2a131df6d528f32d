//! What an egress entry (`host`, `host:port`, `[v6]:port`, `*.domain`) names, and
//! whether an address is a globally routable public one: one rule for the gateway's
//! tenant policy, the provisioner's egress proxy and the checks of the hosts a caller
//! may make a service reach (registries, git hosts: `crate::allowed_hosts`).

use std::{
    net::{IpAddr, Ipv4Addr},
    sync::LazyLock,
};

/// The host part of an egress entry (a port and IPv6 brackets removed).
pub fn host_part(entry: &str) -> &str {
    let h = match entry.rsplit_once(':') {
        Some((h, p)) if (!h.contains(':') || h.ends_with(']')) && p.parse::<u16>().is_ok() => h,
        _ => entry,
    };
    h.trim_start_matches('[').trim_end_matches(']')
}

/// What an address in a special-purpose block is.
#[derive(Debug, Clone, Copy)]
enum Kind {
    /// Not a public address.
    NotPublic,
    /// A translation of the IPv4 address in its bits `shift..shift + 32` (counted from
    /// the low end): that address decides, as the translator would reach it.
    Embeds4 { shift: u32 },
}

use Kind::{Embeds4, NotPublic};

/// Every block that is not globally routable public address space, from IANA's
/// special-purpose address registries (IPv4: iana.org/assignments/iana-ipv4-special-registry,
/// IPv6: iana.org/assignments/iana-ipv6-special-registry; RFC 6890 and its updates to
/// 2025), IANA's IPv4 multicast registry and its IPv6 address space registry (only
/// 2000::/3 is global unicast). The first block an address is in decides.
///
/// Left out on purpose, being globally reachable anycast services that are public:
/// 192.31.196.0/24 (AS112-v4, RFC 7535), 192.52.193.0/24 (AMT, RFC 7450),
/// 192.175.48.0/24 (AS112 direct delegation, RFC 7534), 2620:4f:8000::/48 (the same, v6).
/// The few such services inside 2001::/23 (PCP and TURN anycast, AMT, AS112, ORCHIDv2,
/// DRIP) are refused with the rest of that block: none is a registry, a git host or a
/// host a sandbox has any business with.
#[rustfmt::skip]
const SPECIAL: &[(&str, Kind, &str)] = &[
    ("0.0.0.0/8",          NotPublic, "\"this network\" (RFC 791)"),
    ("10.0.0.0/8",         NotPublic, "private use (RFC 1918)"),
    ("100.64.0.0/10",      NotPublic, "shared address space, CGNAT (RFC 6598)"),
    ("127.0.0.0/8",        NotPublic, "loopback (RFC 1122)"),
    ("169.254.0.0/16",     NotPublic, "link local, cloud metadata services (RFC 3927)"),
    ("172.16.0.0/12",      NotPublic, "private use (RFC 1918)"),
    ("192.0.0.0/24",       NotPublic, "IETF protocol assignments (RFC 6890)"),
    ("192.0.2.0/24",       NotPublic, "documentation, TEST-NET-1 (RFC 5737)"),
    ("192.88.99.0/24",     NotPublic, "6to4 relay anycast, deprecated (RFC 7526)"),
    ("192.168.0.0/16",     NotPublic, "private use (RFC 1918)"),
    ("198.18.0.0/15",      NotPublic, "benchmarking (RFC 2544)"),
    ("198.51.100.0/24",    NotPublic, "documentation, TEST-NET-2 (RFC 5737)"),
    ("203.0.113.0/24",     NotPublic, "documentation, TEST-NET-3 (RFC 5737)"),
    ("224.0.0.0/4",        NotPublic, "multicast (RFC 5771)"),
    ("240.0.0.0/4",        NotPublic, "reserved (RFC 1112)"),
    ("255.255.255.255/32", NotPublic, "limited broadcast (RFC 919, RFC 8190)"),
    ("::1/128",            NotPublic, "loopback (RFC 4291)"),
    ("::/128",             NotPublic, "unspecified (RFC 4291)"),
    ("::ffff:0:0/96",      NotPublic, "IPv4-mapped (RFC 4291)"),
    ("::/96",              NotPublic, "IPv4-compatible, deprecated (RFC 4291)"),
    ("64:ff9b::/96",       Embeds4 { shift: 0 }, "NAT64 well-known prefix (RFC 6052)"),
    ("64:ff9b:1::/48",     NotPublic, "NAT64 local-use prefix (RFC 8215)"),
    ("100::/64",           NotPublic, "discard-only (RFC 6666)"),
    ("100:0:0:1::/64",     NotPublic, "dummy prefix (RFC 9780)"),
    ("2001::/32",          NotPublic, "Teredo (RFC 4380)"),
    ("2001:2::/48",        NotPublic, "benchmarking (RFC 5180)"),
    ("2001::/23",          NotPublic, "IETF protocol assignments (RFC 2928)"),
    ("2001:db8::/32",      NotPublic, "documentation (RFC 3849)"),
    ("2002::/16",          Embeds4 { shift: 80 }, "6to4 (RFC 3056)"),
    ("3fff::/20",          NotPublic, "documentation (RFC 9637)"),
    ("5f00::/16",          NotPublic, "segment routing SIDs (RFC 9602)"),
    ("fc00::/7",           NotPublic, "unique local (RFC 4193)"),
    ("fe80::/10",          NotPublic, "link-local unicast (RFC 4291)"),
    ("fec0::/10",          NotPublic, "site-local, deprecated (RFC 3879)"),
    ("ff00::/8",           NotPublic, "multicast (RFC 4291)"),
    // The rest of the IPv6 space outside 2000::/3: unallocated (IANA IPv6 address
    // space registry; RFC 4291 section 2.4).
    ("::/3",               NotPublic, "unallocated (IANA IPv6 address space)"),
    ("4000::/2",           NotPublic, "unallocated (IANA IPv6 address space)"),
    ("8000::/1",           NotPublic, "unallocated (IANA IPv6 address space)"),
];

/// A block of [`SPECIAL`]: its first address as bits, its prefix length, what it is.
struct Block {
    v4: bool,
    net: u128,
    len: u32,
    kind: Kind,
    what: &'static str,
}

/// [`SPECIAL`] parsed once (its text is the readable form; a test parses every line).
static BLOCKS: LazyLock<Vec<Block>> = LazyLock::new(|| {
    SPECIAL
        .iter()
        .map(|(cidr, kind, what)| {
            let (net, len) = cidr.split_once('/').expect("a prefix length");
            let net: IpAddr = net.parse().expect("an address");
            Block {
                v4: net.is_ipv4(),
                net: bits(net),
                len: len.parse().expect("a prefix length"),
                kind: *kind,
                what,
            }
        })
        .collect()
});

fn bits(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(a) => a.to_bits().into(),
        IpAddr::V6(a) => a.to_bits(),
    }
}

impl Block {
    fn contains(&self, ip: IpAddr) -> bool {
        let width = if ip.is_ipv4() { 32 } else { 128 };
        self.v4 == ip.is_ipv4()
            && (self.len == 0 || (bits(ip) ^ self.net) >> (width - self.len) == 0)
    }
}

/// Not a globally routable public address: loopback, private, link-local (cloud
/// metadata services among them), CGNAT, multicast, reserved, documentation and the
/// rest of [`SPECIAL`]; a NAT64 or 6to4 address by the IPv4 address it stands for. The
/// host's own services, the mesh's and its networks', never a caller's by default.
pub fn internal(ip: IpAddr) -> bool {
    special_block(ip).is_some()
}

/// The name of the special-purpose block `ip` is in (for logs: "shared address space,
/// CGNAT (RFC 6598)"); `None` for a public address.
pub fn special_block(ip: IpAddr) -> Option<&'static str> {
    let block = BLOCKS.iter().find(|b| b.contains(ip))?;
    match (block.kind, ip) {
        (Kind::Embeds4 { shift }, IpAddr::V6(a)) => {
            // The mask keeps 32 bits: the cast cannot truncate.
            let v4 = ((a.to_bits() >> shift) & 0xffff_ffff) as u32;
            special_block(IpAddr::V4(Ipv4Addr::from_bits(v4))).map(|_| block.what)
        }
        _ => Some(block.what),
    }
}

/// A `localhost` name.
pub fn is_localhost(host: &str) -> bool {
    let host = host.strip_suffix('.').unwrap_or(host);
    host.eq_ignore_ascii_case("localhost") || host.to_ascii_lowercase().ends_with(".localhost")
}

#[cfg(test)]
#[path = "hosts_tests.rs"]
mod tests;
