//! The operator's ceilings on what one create may ask for: memory, disk, processes and
//! lifetime. `validate::limits` refuses values that mean no limit at all; these refuse
//! values this host should not give one sandbox (1 TiB of memory, a million processes, a
//! lifetime ending in 2163), which would leave a sandbox bounded by nothing in practice.

use crate::{
    error::{ProvisionerError, Result},
    local::isolation::cgroup::Limits,
};
use forkyard_proto::sandbox::v1::CreateSandboxRequest;

/// The ceilings (`--sandbox-max-*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Maxima {
    pub memory_bytes: u64,
    pub disk_bytes: u64,
    pub pids: u32,
    pub ttl_secs: u32,
}

impl Maxima {
    /// 32 GiB, 100 GiB, 16,384 processes, 7 days: well above the defaults (4 GiB, 10 GiB,
    /// 1,024, 4 hours) and any one agent's task.
    pub const DEFAULT: Self = Self {
        memory_bytes: 32 << 30,
        disk_bytes: 100 << 30,
        pids: 16_384,
        ttl_secs: 7 * 24 * 3600,
    };

    /// Whether `req` asks for no more than the ceilings; INVALID_ARGUMENT naming the
    /// field otherwise. 0 (the default) is always within them.
    pub(crate) fn check(&self, req: &CreateSandboxRequest) -> Result<()> {
        let l = req.limits.unwrap_or_default();
        over(
            "limits.memory_bytes",
            l.memory_bytes,
            self.memory_bytes,
            "bytes",
        )?;
        over("limits.disk_bytes", l.disk_bytes, self.disk_bytes, "bytes")?;
        over("limits.pids", l.pids.into(), self.pids.into(), "processes")?;
        over(
            "ttl_secs",
            req.ttl_secs.into(),
            self.ttl_secs.into(),
            "seconds",
        )
    }
}

fn over(field: &'static str, asked: u64, max: u64, unit: &str) -> Result<()> {
    if asked > max {
        return Err(ProvisionerError::invalid(
            field,
            format!("{asked} is over this provisioner's maximum of {max} {unit}"),
        ));
    }
    Ok(())
}

/// `--sandbox-max-*`: the ceilings a create may ask for.
#[derive(Debug, Clone, clap::Args)]
pub struct MaximaArgs {
    /// The most memory a create may ask for, in bytes.
    #[arg(long, env = "FORKYARD_SANDBOX_MAX_MEMORY_BYTES", default_value_t = Maxima::DEFAULT.memory_bytes)]
    pub sandbox_max_memory_bytes: u64,
    /// The largest disk bound a create may ask for, in bytes.
    #[arg(long, env = "FORKYARD_SANDBOX_MAX_DISK_BYTES", default_value_t = Maxima::DEFAULT.disk_bytes)]
    pub sandbox_max_disk_bytes: u64,
    /// The most processes and threads a create may ask for.
    #[arg(long, env = "FORKYARD_SANDBOX_MAX_PIDS", default_value_t = Maxima::DEFAULT.pids)]
    pub sandbox_max_pids: u32,
    /// The longest lifetime (`ttl_secs`) a create may ask for, in seconds.
    #[arg(long, env = "FORKYARD_SANDBOX_MAX_TTL_SECS", default_value_t = Maxima::DEFAULT.ttl_secs)]
    pub sandbox_max_ttl_secs: u32,
}

impl MaximaArgs {
    /// The ceilings, each at least the default a create without the field gets (a
    /// default above its ceiling would give every such sandbox what no caller may ask
    /// for); the first setting that is not, named.
    /// `limits`, `disk_bytes` and `ttl` are the local backend's defaults.
    pub fn maxima(
        &self,
        limits: Limits,
        disk_bytes: u64,
        ttl: std::time::Duration,
    ) -> std::result::Result<Maxima, String> {
        let m = Maxima {
            memory_bytes: self.sandbox_max_memory_bytes,
            disk_bytes: self.sandbox_max_disk_bytes,
            pids: self.sandbox_max_pids,
            ttl_secs: self.sandbox_max_ttl_secs,
        };
        let d = limits;
        let ttl = ttl.as_secs();
        for (flag, max, default) in [
            (
                "--sandbox-max-memory-bytes (FORKYARD_SANDBOX_MAX_MEMORY_BYTES)",
                m.memory_bytes,
                d.memory_bytes,
            ),
            (
                "--sandbox-max-disk-bytes (FORKYARD_SANDBOX_MAX_DISK_BYTES)",
                m.disk_bytes,
                disk_bytes,
            ),
            (
                "--sandbox-max-pids (FORKYARD_SANDBOX_MAX_PIDS)",
                m.pids.into(),
                d.pids,
            ),
            (
                "--sandbox-max-ttl-secs (FORKYARD_SANDBOX_MAX_TTL_SECS)",
                m.ttl_secs.into(),
                ttl,
            ),
        ] {
            if max < default {
                return Err(format!(
                    "{flag}: {max} is below the default a sandbox gets ({default})"
                ));
            }
        }
        Ok(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use forkyard_proto::sandbox::v1::SandboxLimits;

    fn asking(limits: SandboxLimits, ttl_secs: u32) -> CreateSandboxRequest {
        CreateSandboxRequest {
            limits: Some(limits),
            ttl_secs,
            ..Default::default()
        }
    }

    #[test]
    fn what_a_create_asks_past_a_ceiling_is_refused_naming_the_field() {
        let m = Maxima::DEFAULT;
        assert!(m.check(&CreateSandboxRequest::default()).is_ok());
        let at = SandboxLimits {
            memory_bytes: m.memory_bytes,
            disk_bytes: m.disk_bytes,
            pids: m.pids,
            cpu_millis: 0,
        };
        assert!(m.check(&asking(at, m.ttl_secs)).is_ok());
        for (field, req) in [
            (
                "limits.memory_bytes",
                asking(
                    SandboxLimits {
                        memory_bytes: 1 << 40,
                        ..at
                    },
                    0,
                ),
            ),
            (
                "limits.disk_bytes",
                asking(
                    SandboxLimits {
                        disk_bytes: 1 << 40,
                        ..at
                    },
                    0,
                ),
            ),
            (
                "limits.pids",
                asking(
                    SandboxLimits {
                        pids: 1_000_000,
                        ..at
                    },
                    0,
                ),
            ),
            // 2163, from 2026.
            ("ttl_secs", asking(at, u32::MAX)),
        ] {
            let e = m.check(&req).unwrap_err();
            assert!(
                matches!(&e, ProvisionerError::InvalidArgument { field: f, .. } if *f == field),
                "{field}: {e}"
            );
            assert!(e.to_string().contains("maximum"), "{e}");
        }
    }
}
