//! The filter, run by a small BPF interpreter for every call number, against the two
//! `seccompiler` filters it replaced (combined as the kernel combines stacked filters).

use super::{CLONE_NEWUSER, ENOSYS, EPERM, RET_ERRNO, filters, refused};
use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};
use std::collections::BTreeMap;

const AUDIT_ARCH_I386: u32 = 0x4000_0003;

/// Runs a classic BPF program on a `struct seccomp_data`; panics on an instruction it
/// does not know, so neither program can hide behind one.
fn run(program: &[u8], nr: u32, arch: u32, arg0: u64) -> u32 {
    let mut data = Vec::with_capacity(64);
    data.extend_from_slice(&nr.to_ne_bytes());
    data.extend_from_slice(&arch.to_ne_bytes());
    data.extend_from_slice(&0u64.to_ne_bytes());
    data.extend_from_slice(&arg0.to_ne_bytes());
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

/// The filters as `seccompiler` compiled them before (a deny list, and `clone3`).
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
    [deny, clone3]
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
fn stacked(programs: &[Vec<u8>], nr: u32, arch: u32, arg0: u64) -> u32 {
    let severity = |ret: u32| i32::from_ne_bytes((ret & 0xffff_0000).to_ne_bytes());
    programs
        .iter()
        .map(|p| run(p, nr, arch, arg0))
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

#[test]
fn every_call_gets_what_the_seccompiler_filters_gave_it() {
    let ours = filters().unwrap();
    let theirs = reference();
    let native = super::audit_arch().unwrap();
    let flags = [
        0,
        CLONE_NEWUSER,
        CLONE_NEWUSER | 0x0000_1234_0001_0011,
        !CLONE_NEWUSER,
        0x0001_2000_0000_0000,
    ];
    let mut refused = 0;
    for arch in [native, AUDIT_ARCH_I386, 0] {
        for nr in (0..2048).chain([u32::MAX, 0x3fff_ffff]) {
            for arg0 in flags {
                let want = stacked(&theirs, nr, arch, arg0);
                let got = stacked(&ours, nr, arch, arg0);
                assert_eq!(got, want, "call {nr} arch {arch:#x} arg0 {arg0:#x}");
                refused += usize::from(got == RET_ERRNO | EPERM);
            }
        }
    }
    // The comparison saw the refusals (every refused call, and clone with the flag).
    assert_eq!(refused, (super::refused().len() * 5) + 2);
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
        assert_eq!(run(ours, nr, native, 0), RET_ERRNO | ENOSYS, "call {nr:#x}");
    }
    // What the filters before it let through.
    assert_eq!(
        stacked(&reference(), 0x4000_0000 | keyctl, native, 0),
        super::RET_ALLOW
    );
}
