//! Checks on request fields that the types do not enforce.

use crate::error::{ProvisionerError, Result};

/// Variables every sandboxed command gets (the local backend's bubblewrap sets them);
/// a request may not set these itself, on either backend.
pub const RESERVED_ENV: &[&str] = &["FORKYARD_SANDBOX_ID"];

/// Linux's limit on one argument or one `NAME=VALUE` string (`MAX_ARG_STRLEN`), NUL
/// included: a longer one cannot be exec'd at all.
pub const MAX_ONE_ENV_BYTES: usize = 128 << 10;
/// The whole of a command's argv, and of its environment, each (Linux allows about 2 MiB
/// for both together with the default stack limit).
pub const MAX_TOTAL_BYTES: usize = 1 << 20;

/// Variables the dynamic loader and glibc read to load code or data from a path of the
/// caller's choosing. They never reach a host process (the environment goes to the
/// sandboxed command only), and a sandboxed command has no use for them that a build
/// script could not set for itself: refused, so no future path can pass them to one.
const LOADER_VARS: &[&str] = &[
    "GCONV_PATH",
    "GETCONF_DIR",
    "GLIBC_TUNABLES",
    "HOSTALIASES",
    "LOCPATH",
    "MALLOC_TRACE",
    "NIS_PATH",
    "NLSPATH",
    "RESOLV_HOST_CONF",
];

/// The bounds of `SandboxLimits` (0 in a field means the provisioner's default). Beyond
/// them a value is no limit at all (a cgroup takes 2^64-1 as "unlimited") or a sandbox
/// that cannot run anything.
pub const MAX_MEMORY_BYTES: u64 = 1 << 40;
pub const MIN_MEMORY_BYTES: u64 = 8 << 20;
/// The kernel's own ceiling on pids (`PID_MAX_LIMIT`).
pub const MAX_PIDS: u32 = 4 << 20;
/// The sandbox's own bubblewrap (two processes) and init (a thread per relay and per
/// running command) count too: below this a sandbox cannot run a shell pipeline.
pub const MIN_PIDS: u32 = 16;
pub const MAX_CPU_MILLIS: u32 = 1024 * 1000;
pub const MIN_CPU_MILLIS: u32 = 10;
pub const MAX_DISK_BYTES: u64 = 1 << 50;

pub(crate) fn limits(l: &forkyard_proto::sandbox::v1::SandboxLimits) -> Result<()> {
    fn bound<T: PartialOrd + Copy + std::fmt::Display + Default>(
        field: &'static str,
        v: T,
        min: T,
        max: T,
        unit: &str,
    ) -> Result<()> {
        if v != T::default() && (v < min || v > max) {
            return Err(ProvisionerError::invalid(
                field,
                format!("{v} is out of range: {min} to {max} {unit} (0: the default)"),
            ));
        }
        Ok(())
    }
    bound(
        "limits.memory_bytes",
        l.memory_bytes,
        MIN_MEMORY_BYTES,
        MAX_MEMORY_BYTES,
        "bytes",
    )?;
    bound("limits.pids", l.pids, MIN_PIDS, MAX_PIDS, "processes")?;
    bound(
        "limits.cpu_millis",
        l.cpu_millis,
        MIN_CPU_MILLIS,
        MAX_CPU_MILLIS,
        "thousandths of a core",
    )?;
    bound(
        "limits.disk_bytes",
        l.disk_bytes,
        1,
        MAX_DISK_BYTES,
        "bytes",
    )
}

pub(crate) fn argv(argv: &[String]) -> Result<()> {
    if argv.first().is_none_or(String::is_empty) {
        return Err(ProvisionerError::invalid("argv", "must name a command"));
    }
    if argv.iter().any(|a| a.contains('\0')) {
        return Err(ProvisionerError::invalid(
            "argv",
            "must not contain NUL bytes",
        ));
    }
    if let Some(a) = argv.iter().find(|a| a.len() + 1 > MAX_ONE_ENV_BYTES) {
        return Err(ProvisionerError::invalid(
            "argv",
            format!(
                "an argument is {} bytes; the limit is {} (pass bigger input as a file)",
                a.len(),
                MAX_ONE_ENV_BYTES - 1
            ),
        ));
    }
    let total: usize = argv.iter().map(|a| a.len() + 1).sum();
    if total > MAX_TOTAL_BYTES {
        return Err(ProvisionerError::invalid(
            "argv",
            format!("is {total} bytes in all; the limit is {MAX_TOTAL_BYTES}"),
        ));
    }
    Ok(())
}

pub(crate) fn env(name: &str, value: &str) -> Result<()> {
    let mut chars = name.chars();
    let valid = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !valid {
        return Err(ProvisionerError::invalid(
            "env",
            format!("{name:?} is not a valid variable name"),
        ));
    }
    if name.starts_with("LD_") || LOADER_VARS.contains(&name) {
        return Err(ProvisionerError::invalid(
            "env",
            format!("{name} is a dynamic loader variable and may not be set"),
        ));
    }
    if RESERVED_ENV.contains(&name) {
        return Err(ProvisionerError::invalid(
            "env",
            format!("{name} is set by the provisioner"),
        ));
    }
    if value.contains('\0') {
        return Err(ProvisionerError::invalid(
            "env",
            format!("value of {name} contains a NUL byte"),
        ));
    }
    if name.len() + value.len() + 2 > MAX_ONE_ENV_BYTES {
        return Err(ProvisionerError::invalid(
            "env",
            format!(
                "{name} is {} bytes; one variable may be at most {} (pass bigger input as a file)",
                name.len() + value.len() + 1,
                MAX_ONE_ENV_BYTES - 1
            ),
        ));
    }
    Ok(())
}

/// The whole environment's size (each variable was checked by [`env`]).
pub(crate) fn env_total<'a>(
    vars: impl IntoIterator<Item = (&'a String, &'a String)>,
) -> Result<()> {
    let total: usize = vars.into_iter().map(|(k, v)| k.len() + v.len() + 2).sum();
    if total > MAX_TOTAL_BYTES {
        return Err(ProvisionerError::invalid(
            "env",
            format!("is {total} bytes in all; the limit is {MAX_TOTAL_BYTES}"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_names_are_validated() {
        assert!(env("RUST_LOG", "x").is_ok());
        assert!(env("_X1", "").is_ok());
        for bad in [
            "",
            "1A",
            "A-B",
            "A=B",
            "FORKYARD_SANDBOX_ID",
            "LD_PRELOAD",
            "LD_LIBRARY_PATH",
            "LD_AUDIT",
            "GCONV_PATH",
            "GLIBC_TUNABLES",
        ] {
            assert!(env(bad, "v").is_err(), "{bad:?} accepted");
        }
        assert!(env("A", "x\0y").is_err());
        assert!(argv(&[]).is_err());
        assert!(argv(&[String::new()]).is_err());
        // One variable at the kernel's limit cannot be exec'd; one below it can.
        assert!(env("A", &"x".repeat(MAX_ONE_ENV_BYTES - 3)).is_ok());
        assert!(env("A", &"x".repeat(MAX_ONE_ENV_BYTES - 2)).is_err());
        let big = "x".repeat(100_000);
        let many: Vec<(String, String)> = (0..11).map(|i| (format!("V{i}"), big.clone())).collect();
        assert!(env_total(many.iter().map(|(k, v)| (k, v))).is_err());
        assert!(env_total(many[..10].iter().map(|(k, v)| (k, v))).is_ok());
    }

    #[test]
    fn limits_beyond_what_a_cgroup_can_mean_are_refused() {
        use forkyard_proto::sandbox::v1::SandboxLimits;
        assert!(limits(&SandboxLimits::default()).is_ok());
        let ok = SandboxLimits {
            memory_bytes: 64 << 20,
            pids: 32,
            cpu_millis: 500,
            disk_bytes: 4 << 20,
        };
        assert!(limits(&ok).is_ok());
        for bad in [
            SandboxLimits {
                memory_bytes: u64::MAX,
                ..ok
            },
            SandboxLimits {
                memory_bytes: 4096,
                ..ok
            },
            SandboxLimits {
                pids: u32::MAX,
                ..ok
            },
            SandboxLimits { pids: 1, ..ok },
            SandboxLimits {
                cpu_millis: u32::MAX,
                ..ok
            },
            SandboxLimits {
                disk_bytes: u64::MAX,
                ..ok
            },
        ] {
            let e = limits(&bad).unwrap_err();
            assert!(e.to_string().contains("limits."), "{e}");
        }
    }
}
