//! The filter, run by a small BPF interpreter for every call number, against the
//! `seccompiler` filters it replaced, and those of the socket families (combined as the
//! kernel combines stacked filters).

use super::{
    CLONE_NEWUSER, EAFNOSUPPORT, ENOSYS, EPERM, EPROTONOSUPPORT, FAMILIES, NETLINK_PROTOCOLS,
    RET_ALLOW, RET_ERRNO, filters, refused,
};
use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};
use std::collections::BTreeMap;

const AUDIT_ARCH_I386: u32 = 0x4000_0003;

/// A call's first and third arguments (the others are read by no filter).
type Args = (u64, u64);

/// Runs a classic BPF program on a `struct seccomp_data`; panics on an instruction it
/// does not know, so neither program can hide behind one.
fn run(program: &[u8], nr: u32, arch: u32, (arg0, arg2): Args) -> u32 {
    let mut data = Vec::with_capacity(64);
    data.extend_from_slice(&nr.to_ne_bytes());
    data.extend_from_slice(&arch.to_ne_bytes());
    data.extend_from_slice(&0u64.to_ne_bytes());
    data.extend_from_slice(&arg0.to_ne_bytes());
    data.extend_from_slice(&0u64.to_ne_bytes());
    data.extend_from_slice(&arg2.to_ne_bytes());
    data.resize(64, 0);
    let ins: Vec<(u16, u8, u8, u32)> = program
        .chunks_exact(8)
        .map(|c| {
            (
                u16::from_ne_bytes([c[0], c[1]]),
                c[2],
                c[3],
                u32::from_ne_bytes([c[4], c[5], c[6], c[7]]),
            )
        })
        .collect();
    let (mut a, mut pc) = (0u32, 0usize);
    loop {
        let (code, jt, jf, k) = ins[pc];
        pc += 1;
        let jump = |taken: bool| usize::from(if taken { jt } else { jf });
        match code {
            0x20 => {
                let at = usize::try_from(k).unwrap();
                a = u32::from_ne_bytes(data[at..at + 4].try_into().unwrap());
            }
            0x54 => a &= k,
            0x05 => pc += usize::try_from(k).unwrap(),
            0x15 => pc += jump(a == k),
            0x25 => pc += jump(a > k),
            0x35 => pc += jump(a >= k),
            0x45 => pc += jump(a & k != 0),
            0x06 => return k,
            other => panic!("BPF opcode {other:#x} at {}", pc - 1),
        }
    }
}

/// `socket` and `socketpair` refused with `errno` when every one of `conditions` holds.
fn socket_filter(errno: u32, conditions: &[(u8, SeccompCmpOp, u64)]) -> SeccompFilter {
    let arch = TargetArch::try_from(std::env::consts::ARCH).unwrap();
    let rule = || {
        let conditions = conditions
            .iter()
            .map(|(arg, op, value)| {
                SeccompCondition::new(*arg, SeccompCmpArgLen::Dword, op.clone(), *value).unwrap()
            })
            .collect();
        vec![SeccompRule::new(conditions).unwrap()]
    };
    let calls = [libc::SYS_socket, libc::SYS_socketpair]
        .into_iter()
        .map(|nr| (nr, rule()))
        .collect();
    SeccompFilter::new(
        calls,
        SeccompAction::Allow,
        SeccompAction::Errno(errno),
        arch,
    )
    .unwrap()
}

/// The filters as `seccompiler` compiled them before (a deny list, and `clone3`), and
/// two for the socket families: any family but those allowed, netlink but its protocols.
fn reference() -> Vec<Vec<u8>> {
    let arch = TargetArch::try_from(std::env::consts::ARCH).unwrap();
    let mut deny: BTreeMap<i64, Vec<SeccompRule>> =
        refused().into_iter().map(|n| (n, Vec::new())).collect();
    let new_user_ns = SeccompCondition::new(
        0,
        SeccompCmpArgLen::Qword,
        SeccompCmpOp::MaskedEq(CLONE_NEWUSER),
        CLONE_NEWUSER,
    )
    .unwrap();
    deny.insert(
        libc::SYS_clone,
        vec![SeccompRule::new(vec![new_user_ns]).unwrap()],
    );
    let deny = SeccompFilter::new(
        deny,
        SeccompAction::Allow,
        SeccompAction::Errno(EPERM),
        arch,
    )
    .unwrap();
    let clone3 = SeccompFilter::new(
        BTreeMap::from([(libc::SYS_clone3, Vec::new())]),
        SeccompAction::Allow,
        SeccompAction::Errno(ENOSYS),
        arch,
    )
    .unwrap();
    let family = FAMILIES.map(|f| (0, SeccompCmpOp::Ne, u64::from(f)));
    let netlink = std::iter::once((0, SeccompCmpOp::Eq, libc::AF_NETLINK as u64))
        .chain(
            NETLINK_PROTOCOLS
                .into_iter()
                .map(|p| (2, SeccompCmpOp::Ne, u64::from(p))),
        )
        .collect::<Vec<_>>();
    [
        deny,
        clone3,
        socket_filter(EAFNOSUPPORT, &family),
        socket_filter(EPROTONOSUPPORT, &netlink),
    ]
    .into_iter()
    .map(|f| {
        let program: BpfProgram = f.try_into().unwrap();
        program
            .iter()
            .flat_map(|i| {
                let mut b = i.code.to_ne_bytes().to_vec();
                b.extend([i.jt, i.jf]);
                b.extend(i.k.to_ne_bytes());
                b
            })
            .collect()
    })
    .collect()
}

/// Stacked filters as the kernel runs them: every one, the most severe action wins
/// (`ACTION_ONLY` compared as signed), a tie to the later filter.
fn stacked(programs: &[Vec<u8>], nr: u32, arch: u32, args: Args) -> u32 {
    let severity = |ret: u32| i32::from_ne_bytes((ret & 0xffff_0000).to_ne_bytes());
    programs
        .iter()
        .map(|p| run(p, nr, arch, args))
        .reduce(|kept, next| {
            if severity(next) <= severity(kept) {
                next
            } else {
                kept
            }
        })
        .unwrap()
}

#[test]
fn the_filter_is_one_program_of_whole_instructions() {
    let f = filters().unwrap();
    assert_eq!(f.len(), 1);
    assert!(!f[0].is_empty() && f[0].len().is_multiple_of(8));
}

/// The first and third arguments tried with every call: `clone`'s flags, then socket
/// families (the high word set too, which the kernel ignores) with netlink protocols.
fn argument_pairs() -> Vec<Args> {
    let flags = [
        0,
        CLONE_NEWUSER,
        CLONE_NEWUSER | 0x0000_1234_0001_0011,
        !CLONE_NEWUSER,
        0x0001_2000_0000_0000,
    ];
    let families = [1, 2, 10, 16, 17, 38, 40, 44, 0x1_0000_0002, 0x1_0000_0028];
    let netlink = [(16, 12), (16, 0x1_0000_0000), (0x1_0000_0010, 12), (2, 12)];
    flags
        .iter()
        .chain(&families)
        .map(|a| (*a, 0))
        .chain(netlink)
        .collect()
}

#[test]
fn every_call_gets_what_the_seccompiler_filters_gave_it() {
    let ours = filters().unwrap();
    let theirs = reference();
    let native = super::audit_arch().unwrap();
    let pairs = argument_pairs();
    let mut seen = std::collections::HashMap::<u32, usize>::new();
    for arch in [native, AUDIT_ARCH_I386, 0] {
        for nr in (0..2048).chain([u32::MAX, 0x3fff_ffff]) {
            for &args in &pairs {
                let want = stacked(&theirs, nr, arch, args);
                let got = stacked(&ours, nr, arch, args);
                assert_eq!(got, want, "call {nr} arch {arch:#x} args {args:#x?}");
                *seen.entry(got).or_default() += 1;
            }
        }
    }
    // The comparison saw the refusals: every refused call with every argument, clone
    // with the flag; and both socket refusals.
    let eperm = seen[&(RET_ERRNO | EPERM)];
    assert_eq!(eperm, super::refused().len() * pairs.len() + 2);
    assert!(seen[&(RET_ERRNO | EAFNOSUPPORT)] > 0);
    assert!(seen[&(RET_ERRNO | EPROTONOSUPPORT)] > 0);
}

#[test]
fn only_the_allowed_socket_families_and_netlink_protocols_open() {
    let ours = &filters().unwrap()[0];
    let native = super::audit_arch().unwrap();
    let socket = |nr: i64, family: i32, protocol: u64| {
        let family = u64::try_from(family).unwrap();
        run(ours, u32::try_from(nr).unwrap(), native, (family, protocol))
    };
    for nr in [libc::SYS_socket, libc::SYS_socketpair] {
        for family in [libc::AF_UNIX, libc::AF_INET, libc::AF_INET6] {
            assert_eq!(socket(nr, family, 0), RET_ALLOW, "{nr} {family}");
        }
        assert_eq!(socket(nr, libc::AF_NETLINK, 0), RET_ALLOW);
        for family in [
            libc::AF_VSOCK,
            libc::AF_PACKET,
            libc::AF_ALG,
            libc::AF_KEY,
            libc::AF_BLUETOOTH,
            libc::AF_XDP,
            libc::AF_TIPC,
            libc::AF_UNSPEC,
            // A family the kernel may add later.
            1000,
        ] {
            assert_eq!(
                socket(nr, family, 0),
                RET_ERRNO | EAFNOSUPPORT,
                "{nr} {family}"
            );
        }
        // The kernel reads an int: bits above it change nothing, either way.
        let vsock_high = 0x1_0000_0000 | u64::try_from(libc::AF_VSOCK).unwrap();
        assert_eq!(
            run(ours, u32::try_from(nr).unwrap(), native, (vsock_high, 0)),
            RET_ERRNO | EAFNOSUPPORT
        );
        for protocol in [libc::NETLINK_NETFILTER, libc::NETLINK_AUDIT, 15] {
            let protocol = u64::try_from(protocol).unwrap();
            assert_eq!(
                socket(nr, libc::AF_NETLINK, protocol),
                RET_ERRNO | EPROTONOSUPPORT,
                "netlink {protocol}"
            );
        }
    }
    // io_uring could make the socket without a `socket` call.
    let setup = u32::try_from(libc::SYS_io_uring_setup).unwrap();
    assert_eq!(run(ours, setup, native, (0, 0)), RET_ERRNO | EPERM);
}

#[cfg(target_arch = "x86_64")]
#[test]
fn an_x32_call_answers_enosys_whatever_its_number() {
    let ours = &filters().unwrap()[0];
    let native = super::audit_arch().unwrap();
    let keyctl = u32::try_from(libc::SYS_keyctl).unwrap();
    for nr in [
        0x4000_0000,
        0x4000_0000 | keyctl,
        0x4000_0000 | 200,
        0x7fff_ffff,
        0xffff_fffe,
    ] {
        assert_eq!(
            run(ours, nr, native, (0, 0)),
            RET_ERRNO | ENOSYS,
            "call {nr:#x}"
        );
    }
    // What the filters before it let through.
    assert_eq!(
        stacked(&reference(), 0x4000_0000 | keyctl, native, (0, 0)),
        RET_ALLOW
    );
}
