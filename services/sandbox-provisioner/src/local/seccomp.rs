//! The system calls a sandboxed command may not make, as seccomp filters bwrap installs
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
//! port I/O. `clone3` answers ENOSYS: its flags are in memory a filter cannot read, and
//! on ENOSYS the C library falls back to `clone`, which the filter can. `ptrace` stays:
//! the sandbox's own pid namespace bounds it to the sandbox's processes.

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};
use std::collections::BTreeMap;

const EPERM: u32 = 1;
const ENOSYS: u32 = 38;
const CLONE_NEWUSER: u64 = 0x1000_0000;

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
        #[cfg(target_arch = "x86_64")]
        libc::SYS_iopl,
        #[cfg(target_arch = "x86_64")]
        libc::SYS_ioperm,
    ]
}

fn arch() -> Result<TargetArch, String> {
    TargetArch::try_from(std::env::consts::ARCH)
        .map_err(|e| format!("no seccomp filter for {}: {e:?}", std::env::consts::ARCH))
}

fn bytes(program: BpfProgram) -> Vec<u8> {
    let mut out = Vec::with_capacity(program.len() * 8);
    for ins in program {
        out.extend_from_slice(&ins.code.to_ne_bytes());
        out.push(ins.jt);
        out.push(ins.jf);
        out.extend_from_slice(&ins.k.to_ne_bytes());
    }
    out
}

/// The filters, compiled: each a `struct sock_filter` array as bwrap reads it.
pub fn filters() -> Result<Vec<Vec<u8>>, String> {
    let arch = arch()?;
    let mut deny: BTreeMap<i64, Vec<SeccompRule>> =
        refused().into_iter().map(|n| (n, Vec::new())).collect();
    let new_user_ns = SeccompCondition::new(
        0,
        SeccompCmpArgLen::Qword,
        SeccompCmpOp::MaskedEq(CLONE_NEWUSER),
        CLONE_NEWUSER,
    )
    .map_err(|e| format!("seccomp: {e:?}"))?;
    deny.insert(
        libc::SYS_clone,
        vec![SeccompRule::new(vec![new_user_ns]).map_err(|e| format!("seccomp: {e:?}"))?],
    );
    let deny = SeccompFilter::new(
        deny,
        SeccompAction::Allow,
        SeccompAction::Errno(EPERM),
        arch,
    )
    .map_err(|e| format!("seccomp: {e:?}"))?;
    let clone3 = SeccompFilter::new(
        BTreeMap::from([(libc::SYS_clone3, Vec::new())]),
        SeccompAction::Allow,
        SeccompAction::Errno(ENOSYS),
        arch,
    )
    .map_err(|e| format!("seccomp: {e:?}"))?;
    let mut out = Vec::new();
    for f in [deny, clone3] {
        let program: BpfProgram = f.try_into().map_err(|e| format!("seccomp: {e:?}"))?;
        out.push(bytes(program));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_filters_compile_to_whole_instructions() {
        let f = super::filters().unwrap();
        assert_eq!(f.len(), 2);
        assert!(f.iter().all(|p| !p.is_empty() && p.len() % 8 == 0));
    }
}
