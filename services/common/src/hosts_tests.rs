use super::*;

#[test]
fn hosts_of_entries() {
    assert_eq!(host_part("example.com:443"), "example.com");
    assert_eq!(host_part("[::1]:7233"), "::1");
    assert_eq!(host_part("[fe80::1]"), "fe80::1");
    assert_eq!(host_part("*.github.com"), "*.github.com");
    assert!(is_localhost("api.localhost") && !is_localhost("localhost.example"));
    assert!(is_localhost("LOCALHOST.") && is_localhost("a.localhost."));
}

fn check(inside: &[&str], outside: &[&str]) {
    for ip in inside {
        assert!(
            internal(ip.parse().unwrap()),
            "{ip} taken for a public address"
        );
    }
    for ip in outside {
        assert!(
            !internal(ip.parse().unwrap()),
            "{ip} taken for an internal address"
        );
    }
}

/// One test per special-purpose block: addresses at its edges inside, and the public
/// neighbours just outside where there are any.
macro_rules! blocks {
    ($($name:ident: [$($inside:literal),*] not [$($outside:literal),*];)*) => {
        $(#[test] fn $name() { check(&[$($inside),*], &[$($outside),*]); })*
    };
}

blocks! {
    v4_this_network: ["0.0.0.0", "0.255.255.255"] not ["1.0.0.0"];
    v4_private_10: ["10.0.0.0", "10.255.255.255"] not ["11.0.0.0", "9.255.255.255"];
    v4_cgnat: ["100.64.0.0", "100.100.100.200", "100.127.255.255"] not ["100.63.255.255", "100.128.0.0"];
    v4_loopback: ["127.0.0.1", "127.255.255.254"] not ["128.0.0.0"];
    v4_link_local_and_metadata: ["169.254.169.254", "169.254.0.0"] not ["169.253.255.255", "169.255.0.0"];
    v4_private_172: ["172.16.0.0", "172.31.255.255"] not ["172.15.255.255", "172.32.0.0"];
    v4_ietf_protocol_assignments: ["192.0.0.0", "192.0.0.8", "192.0.0.170", "192.0.0.255"] not ["192.0.1.0"];
    v4_documentation_1: ["192.0.2.0", "192.0.2.255"] not ["192.0.3.0"];
    v4_6to4_relay_anycast: ["192.88.99.1"] not ["192.88.98.255", "192.88.100.0"];
    v4_private_192_168: ["192.168.0.0", "192.168.255.255"] not ["192.169.0.0"];
    v4_benchmarking: ["198.18.0.0", "198.19.255.255"] not ["198.17.255.255", "198.20.0.0"];
    v4_documentation_2: ["198.51.100.0", "198.51.100.255"] not ["198.51.101.0"];
    v4_documentation_3: ["203.0.113.0", "203.0.113.255"] not ["203.0.114.0"];
    v4_multicast: ["224.0.0.1", "239.255.255.255"] not ["223.255.255.255"];
    v4_reserved: ["240.0.0.0", "254.255.255.255"] not [];
    v4_limited_broadcast: ["255.255.255.255"] not [];
    v6_loopback: ["::1"] not [];
    v6_unspecified: ["::"] not [];
    v6_ipv4_mapped: ["::ffff:192.168.1.1", "::ffff:1.1.1.1", "::ffff:127.0.0.1"] not [];
    v6_ipv4_compatible: ["::127.0.0.1", "::1.1.1.1", "::a00:1"] not [];
    v6_nat64_well_known_by_its_v4: ["64:ff9b::127.0.0.1", "64:ff9b::10.0.0.1", "64:ff9b::169.254.169.254", "64:ff9b::100.64.0.1"] not ["64:ff9b::1.1.1.1", "64:ff9b::8.8.8.8"];
    v6_nat64_local_use: ["64:ff9b:1::1.1.1.1", "64:ff9b:1:ffff::1"] not [];
    v6_discard_only: ["100::", "100::ffff:ffff:ffff:ffff"] not [];
    v6_dummy_prefix: ["100:0:0:1::1"] not [];
    v6_teredo: ["2001::1", "2001:0:ffff:ffff::1"] not [];
    v6_benchmarking: ["2001:2::1"] not [];
    v6_ietf_protocol_assignments: ["2001:1::1", "2001:1ff:ffff::1"] not ["2001:200::1"];
    v6_documentation: ["2001:db8::1", "2001:db8:ffff::1", "3fff::1", "3fff:fff:ffff::1"] not ["3fff:1000::1"];
    v6_6to4_by_its_v4: ["2002:7f00:1::1", "2002:a00:1::", "2002:a9fe:a9fe::1", "2002:6440:1::1"] not ["2002:101:101::1", "2002:808:808::1"];
    v6_srv6_sids: ["5f00::1"] not [];
    v6_unique_local: ["fc00::1", "fd00:ec2::254", "fdff::1"] not [];
    v6_link_local: ["fe80::1", "febf::1"] not [];
    v6_site_local: ["fec0::1", "feff::1"] not [];
    v6_multicast: ["ff02::1", "ff0e::1"] not [];
    v6_outside_global_unicast: ["1000::1", "4000::1", "8000::1", "e000::1"] not ["2000::1", "3ffe::1"];
}

#[test]
fn public_addresses_are_public() {
    check(
        &[],
        &[
            "1.1.1.1",
            "8.8.8.8",
            "140.82.112.3",
            "2606:4700:4700::1111",
            "2a00:1450:4001::1",
        ],
    );
}

#[test]
fn logs_can_say_which_block() {
    assert_eq!(
        special_block("100.100.100.200".parse().unwrap()),
        Some("shared address space, CGNAT (RFC 6598)")
    );
    assert_eq!(
        special_block("64:ff9b::a9fe:a9fe".parse().unwrap()),
        Some("NAT64 well-known prefix (RFC 6052)")
    );
    assert_eq!(special_block("1.1.1.1".parse().unwrap()), None);
}

#[test]
fn every_block_of_the_table_parses_and_has_no_host_bits() {
    assert_eq!(BLOCKS.len(), SPECIAL.len());
    for (b, (cidr, _, _)) in BLOCKS.iter().zip(SPECIAL) {
        let width = if b.v4 { 32 } else { 128 };
        assert!(b.len <= width, "{cidr}");
        if b.len < width {
            let host_bits = b.net & ((1u128 << (width - b.len)) - 1);
            assert_eq!(host_bits, 0, "{cidr}");
        }
    }
}
