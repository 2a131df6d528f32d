//! The system calls a sandboxed command may not make, as the seccomp filter bwrap installs
//! just before it execs the command (`--add-seccomp-fd`): the kernel's attack surface
//! that a coding agent has no use for, as container runtimes' default profiles (and
//! Codex's own Linux sandbox) close it. Everything else is allowed, so git, compilers,
//! package managers and the agent CLIs run as on the host.
//!
//! Refused with EPERM: keyrings (`keyctl`, `add_key`, `request_key`), `bpf`,
//! `userfaultfd`, `perf_event_open`, new namespaces (`unshare`, `setns`, `clone` with
//! `CLONE_NEWUSER`), mounts (`mount`, `umount2`, `pivot_root`, the new mount API), kernel
//! modules, kexec and reboot, clocks (`settimeofday`, `clock_settime`, `clock_adjtime`,
//! `adjtimex`), swap, accounting, quotas, `syslog`, file handles (`open_by_handle_at`),
//! port I/O, `io_uring` (see below). `clone3` answers ENOSYS: its flags are in memory a
//! filter cannot read, and on ENOSYS the C library falls back to `clone`, which the
//! filter can. `ptrace` stays: the sandbox's own pid namespace bounds it to the sandbox's
//! processes.
//!
//! Sockets: `socket` and `socketpair` of a family other than `AF_UNIX`, `AF_INET`,
//! `AF_INET6` and `AF_NETLINK` answer EAFNOSUPPORT, as a kernel without the family
//! does, and a netlink socket other than `NETLINK_ROUTE` (what `getifaddrs` and the C
//! library's `getaddrinfo` read) EPROTONOSUPPORT. The network namespace covers only
//! those families: `AF_VSOCK` reaches the hypervisor and every VM on its transport
//! whatever the namespace, and the others (`AF_PACKET`, `AF_ALG`, `AF_KEY`,
//! `AF_BLUETOOTH`, `AF_XDP`, ... and the netlink protocols of netfilter, audit, uevents)
//! are kernel code no coding tool needs, often loaded as a module at the first socket.
//! An allowlist, so a family added to the kernel later is refused too. `io_uring` is
//! refused (EPERM, what `kernel.io_uring_disabled` answers) because its `SOCKET` opcode
//! makes a socket of any family without a `socket` call for the filter to see; programs
//! fall back to plain calls, as in Docker's default profile, which refuses it too. On
//! x86_64 the
//! x32 ABI's calls (numbers with bit 30 set, the same audit arch) answer ENOSYS, as on a
//! kernel built without it: a filter that only matched the 64-bit numbers would let
//! `keyctl` through as x32's on a kernel that has it. Another architecture's calls
//! (`int 0x80`) kill the process.
//!
//! One filter, compiled here: a binary search over the refused numbers. The kernel runs
//! a filter for every number at load to find the calls it may allow without running it
//! again (its action cache), so a sandbox's start pays for each filter's length once per
//! number: two linear filters (one from `seccompiler`, one for `clone3`) were about
//! 0.4 ms of every sandbox's start on a VM. The tests check the program against the
//! `seccompiler` pair call by call.

const EPERM: u32 = 1;
const ENOSYS: u32 = 38;
const EAFNOSUPPORT: u32 = 97;
const EPROTONOSUPPORT: u32 = 93;
const CLONE_NEWUSER: u64 = 0x1000_0000;

/// The socket families a sandboxed command may open (`socket`'s and `socketpair`'s
/// first argument); netlink only as [`NETLINK_PROTOCOLS`].
const FAMILIES: [u32; 4] = [
    libc::AF_UNIX as u32,
    libc::AF_INET as u32,
    libc::AF_INET6 as u32,
    libc::AF_NETLINK as u32,
];
/// The netlink protocols allowed (`socket`'s third argument): the routing tables and
/// addresses, which `getifaddrs` reads.
const NETLINK_PROTOCOLS: [u32; 1] = [libc::NETLINK_ROUTE as u32];

/// The refused calls; each is refused whatever its arguments.
fn refused() -> Vec<i64> {
    vec![
        libc::SYS_keyctl,
        libc::SYS_add_key,
        libc::SYS_request_key,
        libc::SYS_bpf,
        libc::SYS_userfaultfd,
        libc::SYS_perf_event_open,
        libc::SYS_unshare,
        libc::SYS_setns,
        libc::SYS_mount,
        libc::SYS_umount2,
        libc::SYS_pivot_root,
        libc::SYS_move_mount,
        libc::SYS_open_tree,
        libc::SYS_fsopen,
        libc::SYS_fsmount,
        libc::SYS_fsconfig,
        libc::SYS_fspick,
        libc::SYS_mount_setattr,
        libc::SYS_init_module,
        libc::SYS_finit_module,
        libc::SYS_delete_module,
        libc::SYS_kexec_load,
        libc::SYS_kexec_file_load,
        libc::SYS_reboot,
        libc::SYS_settimeofday,
        libc::SYS_clock_settime,
        libc::SYS_clock_adjtime,
        libc::SYS_adjtimex,
        libc::SYS_swapon,
        libc::SYS_swapoff,
        libc::SYS_acct,
        libc::SYS_quotactl,
        libc::SYS_syslog,
        libc::SYS_open_by_handle_at,
        libc::SYS_name_to_handle_at,
        libc::SYS_io_uring_setup,
        libc::SYS_io_uring_enter,
        libc::SYS_io_uring_register,
        #[cfg(target_arch = "x86_64")]
        libc::SYS_iopl,
        #[cfg(target_arch = "x86_64")]
        libc::SYS_ioperm,
    ]
}

/// seccomp's return values (`SECCOMP_RET_*`).
const RET_ALLOW: u32 = 0x7fff_0000;
const RET_ERRNO: u32 = 0x0005_0000;
const RET_KILL_PROCESS: u32 = 0x8000_0000;
/// `struct seccomp_data`: the call's number, its audit arch, the low words of its first
/// and third arguments (the kernel reads an `int` argument from the low word only).
const NR: u32 = 0;
const ARCH: u32 = 4;
#[cfg(target_endian = "little")]
const ARG0_LOW: u32 = 16;
#[cfg(target_endian = "big")]
const ARG0_LOW: u32 = 20;
const ARG2_LOW: u32 = ARG0_LOW + 16;
#[cfg(target_arch = "x86_64")]
const X32_SYSCALL_BIT: u32 = 0x4000_0000;

/// Classic BPF opcodes: load a word of the data, the three conditional jumps, return.
const LD_W_ABS: u16 = 0x20;
const JEQ: u16 = 0x15;
const JGE: u16 = 0x35;
const JSET: u16 = 0x45;
const RET: u16 = 0x06;

/// The kernel's `AUDIT_ARCH_*` of the architecture the provisioner runs on.
fn audit_arch() -> Result<u32, String> {
    match std::env::consts::ARCH {
        "x86_64" => Ok(0xc000_003e),
        "aarch64" => Ok(0xc000_00b7),
        "riscv64" => Ok(0xc000_00f3),
        other => Err(format!("no seccomp filter for {other}")),
    }
}

/// What the filter does with a call.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
enum Verdict {
    Allow,
    Refuse,
    NoSys,
    /// `clone`: refused when its flags ask for a new user namespace.
    CloneFlags,
    /// `socket`, `socketpair`: allowed for [`FAMILIES`] only.
    Socket,
    NoFamily,
    NoProtocol,
    Kill,
}

/// Every call the filter does not simply allow, by number.
fn special() -> Vec<(u32, Verdict)> {
    let mut calls: Vec<(u32, Verdict)> = refused()
        .into_iter()
        .map(|nr| (nr, Verdict::Refuse))
        .chain([
            (libc::SYS_clone, Verdict::CloneFlags),
            (libc::SYS_clone3, Verdict::NoSys),
            (libc::SYS_socket, Verdict::Socket),
            (libc::SYS_socketpair, Verdict::Socket),
        ])
        .map(|(nr, v)| (u32::try_from(nr).expect("a call's number"), v))
        .collect();
    calls.sort_unstable_by_key(|c| c.0);
    calls
}

/// A place in the program: a node of the search, or the code of a verdict.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
enum Label {
    Node(usize),
    Verdict(Verdict),
}

/// A jump's target: the next instruction, or a label.
#[derive(Clone, Copy)]
enum To {
    Next,
    At(Label),
}

/// Jumps to a verdict's code.
fn to(verdict: Verdict) -> To {
    To::At(Label::Verdict(verdict))
}

enum Op {
    Mark(Label),
    Load(u32),
    Jump(u16, u32, To, To),
    Return(u32),
}

/// A binary search over `calls` (sorted): `jge` on the middle number while more than a
/// few are left, then a `jeq` each; a number not among them is allowed.
fn search(calls: &[(u32, Verdict)], ops: &mut Vec<Op>, labels: &mut usize) {
    if calls.len() <= 4 {
        for (i, &(nr, verdict)) in calls.iter().enumerate() {
            let miss = if i + 1 == calls.len() {
                to(Verdict::Allow)
            } else {
                To::Next
            };
            ops.push(Op::Jump(JEQ, nr, to(verdict), miss));
        }
        return;
    }
    let (low, high) = calls.split_at(calls.len() / 2);
    *labels += 1;
    let upper = Label::Node(*labels);
    ops.push(Op::Jump(JGE, high[0].0, To::At(upper), To::Next));
    search(low, ops, labels);
    ops.push(Op::Mark(upper));
    search(high, ops, labels);
}

/// The filter's instructions, before their jumps are resolved.
fn program(arch: u32) -> Vec<Op> {
    let mut ops = vec![
        Op::Load(ARCH),
        Op::Jump(JEQ, arch, To::Next, to(Verdict::Kill)),
        Op::Load(NR),
    ];
    // Node 0 is the x32 block; the search's own nodes follow.
    let mut labels = 0;
    #[cfg(target_arch = "x86_64")]
    ops.push(Op::Jump(
        JGE,
        X32_SYSCALL_BIT,
        To::At(Label::Node(0)),
        To::Next,
    ));
    search(&special(), &mut ops, &mut labels);
    #[cfg(target_arch = "x86_64")]
    // -1 is no call at all (a tracer skipping one): left to the kernel, as allowed.
    ops.extend([
        Op::Mark(Label::Node(0)),
        Op::Jump(JEQ, u32::MAX, to(Verdict::Allow), to(Verdict::NoSys)),
    ]);
    ops.extend([
        Op::Mark(Label::Verdict(Verdict::CloneFlags)),
        Op::Load(ARG0_LOW),
        Op::Jump(
            JSET,
            // Within the low word: the kernel reads only it of a `clone`'s flags.
            u32::try_from(CLONE_NEWUSER).expect("a low-word flag"),
            to(Verdict::Refuse),
            to(Verdict::Allow),
        ),
    ]);
    ops.extend(socket_checks());
    for (verdict, ret) in [
        (Verdict::Allow, RET_ALLOW),
        (Verdict::Refuse, RET_ERRNO | EPERM),
        (Verdict::NoSys, RET_ERRNO | ENOSYS),
        (Verdict::NoFamily, RET_ERRNO | EAFNOSUPPORT),
        (Verdict::NoProtocol, RET_ERRNO | EPROTONOSUPPORT),
        (Verdict::Kill, RET_KILL_PROCESS),
    ] {
        ops.extend([Op::Mark(Label::Verdict(verdict)), Op::Return(ret)]);
    }
    ops
}

/// A `socket` or `socketpair` call: its family one of [`FAMILIES`], a netlink one's
/// protocol one of [`NETLINK_PROTOCOLS`].
fn socket_checks() -> Vec<Op> {
    let mut ops = vec![
        Op::Mark(Label::Verdict(Verdict::Socket)),
        Op::Load(ARG0_LOW),
    ];
    let netlink = libc::AF_NETLINK as u32;
    for family in FAMILIES.into_iter().filter(|f| *f != netlink) {
        ops.push(Op::Jump(JEQ, family, to(Verdict::Allow), To::Next));
    }
    ops.extend([
        Op::Jump(JEQ, netlink, To::Next, to(Verdict::NoFamily)),
        Op::Load(ARG2_LOW),
    ]);
    let last = NETLINK_PROTOCOLS.len() - 1;
    for (i, protocol) in NETLINK_PROTOCOLS.into_iter().enumerate() {
        let miss = if i == last {
            to(Verdict::NoProtocol)
        } else {
            To::Next
        };
        ops.push(Op::Jump(JEQ, protocol, to(Verdict::Allow), miss));
    }
    ops
}

/// The program's bytes, each jump resolved to the offset of its label.
fn assemble(ops: &[Op]) -> Result<Vec<u8>, String> {
    let mut at = std::collections::HashMap::new();
    let mut n = 0usize;
    for op in ops {
        match op {
            Op::Mark(label) => {
                at.insert(*label, n);
            }
            _ => n += 1,
        }
    }
    let mut out = Vec::with_capacity(n * 8);
    let mut pc = 0usize;
    for op in ops {
        let (code, jt, jf, k) = match *op {
            Op::Mark(_) => continue,
            Op::Load(k) => (LD_W_ABS, 0, 0, k),
            Op::Return(k) => (RET, 0, 0, k),
            Op::Jump(code, k, t, f) => {
                let offset = |to: To| -> Result<u8, String> {
                    let To::At(label) = to else {
                        return Ok(0);
                    };
                    u8::try_from(at[&label] - pc - 1)
                        .map_err(|_| "seccomp: a jump past 255 instructions".to_owned())
                };
                (code, offset(t)?, offset(f)?, k)
            }
        };
        out.extend_from_slice(&code.to_ne_bytes());
        out.extend([jt, jf]);
        out.extend_from_slice(&k.to_ne_bytes());
        pc += 1;
    }
    Ok(out)
}

/// The filter, compiled: a `struct sock_filter` array as bwrap reads it (one; a list,
/// as bwrap takes any number).
pub fn filters() -> Result<Vec<Vec<u8>>, String> {
    Ok(vec![assemble(&program(audit_arch()?))?])
}

#[cfg(test)]
#[path = "seccomp_tests.rs"]
mod tests;
