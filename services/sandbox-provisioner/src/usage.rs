//! What a sandbox uses and what that costs: CPU time from its cgroup's counter, memory
//! held while its commands run (sampled every second), wall time since create; priced
//! by the operator's table. The agent runner charges a fork's sandbox cost to the fork's
//! reservation as the agent runs, and the fork's commit includes the final figure
//! (`CollectPatchResponse.usage`, read after the fork's last command).

use crate::local::{entry::Entry, provisioner::Provisioner};
use forkyard_proto::sandbox::v1::SandboxUsage;
use std::{
    sync::{Arc, Weak},
    time::Duration,
};

const SAMPLE_EVERY: Duration = Duration::from_secs(1);

/// USD per unit of use, as the operator sets them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Prices {
    /// Per CPU-second of a local sandbox.
    pub cpu_second_usd: f64,
    /// Per GiB of memory held for a second by a local sandbox.
    pub gib_second_usd: f64,
    /// Per second of an E2B sandbox's life.
    pub e2b_second_usd: f64,
}

impl Default for Prices {
    /// E2B's published list prices (per vCPU-second, per GiB-second, and its default
    /// 2 vCPU / 512 MiB sandbox per second), so local and remote sandboxes cost alike.
    fn default() -> Self {
        Self {
            cpu_second_usd: 0.000014,
            gib_second_usd: 0.0000045,
            e2b_second_usd: 0.000_030_25,
        }
    }
}

impl Prices {
    pub fn valid(&self) -> bool {
        [
            self.cpu_second_usd,
            self.gib_second_usd,
            self.e2b_second_usd,
        ]
        .iter()
        .all(|p| p.is_finite() && *p >= 0.0 && *p < 1.0)
    }

    /// A local sandbox's use, priced in micro-USD (rounded up: a fraction is spend).
    pub fn local(&self, cpu_ms: u64, memory_mib_seconds: u64) -> i64 {
        let micro = cpu_ms as f64 / 1000.0 * self.cpu_second_usd * 1e6
            + memory_mib_seconds as f64 / 1024.0 * self.gib_second_usd * 1e6;
        (micro - 1e-6).ceil().max(0.0) as i64
    }

    pub fn e2b(&self, wall_ms: u64) -> i64 {
        let micro = wall_ms as f64 / 1000.0 * self.e2b_second_usd * 1e6;
        (micro - 1e-6).ceil().max(0.0) as i64
    }
}

impl Provisioner {
    /// `entry`'s use so far, priced.
    pub(crate) fn usage(&self, entry: &Entry) -> SandboxUsage {
        let (id, created, memory_mib_ms) = {
            let r = entry.record.lock().expect("record lock");
            (r.id.clone(), r.created_unix_ms, r.memory_mib_ms)
        };
        let cpu_ms = self
            .cgroups
            .as_ref()
            .filter(|_| entry.cgroups_made())
            .and_then(|cg| cg.cpu_usec(&id))
            .map_or(0, |us| us / 1000);
        let memory_mib_seconds = memory_mib_ms / 1000;
        SandboxUsage {
            cpu_ms,
            memory_mib_seconds,
            wall_ms: u64::try_from(crate::local::provisioner::now_ms() - created).unwrap_or(0),
            cost_micros: self.config.prices.local(cpu_ms, memory_mib_seconds),
        }
    }

    /// One sample of every sandbox running a command: the memory it holds, for a second.
    fn sample_memory(&self) {
        let Some(cg) = &self.cgroups else { return };
        let live: Vec<Arc<Entry>> = self
            .sandboxes
            .lock()
            .expect("sandboxes lock")
            .values()
            .filter(|e| e.execs.borrow().running > 0 && e.cgroups_made())
            .cloned()
            .collect();
        let step_ms = SAMPLE_EVERY.as_millis() as u64;
        for e in live {
            let id = e.record.lock().expect("record lock").id.clone();
            if let Some(bytes) = cg.memory_bytes(&id) {
                let mut r = e.record.lock().expect("record lock");
                r.memory_mib_ms = r.memory_mib_ms.saturating_add(bytes * step_ms / (1 << 20));
            }
        }
    }
}

/// Sample memory every second, for as long as the core lives.
pub(crate) fn spawn_sampler(core: &Arc<Provisioner>) {
    let weak: Weak<Provisioner> = Arc::downgrade(core);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(SAMPLE_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        loop {
            tick.tick().await;
            let Some(core) = weak.upgrade() else { return };
            // A few file reads per running sandbox; off the async threads all the same.
            let _ = tokio::task::spawn_blocking(move || core.sample_memory()).await;
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prices_round_up_to_whole_micro_dollars() {
        let p = Prices::default();
        // 10 CPU-seconds at $0.000014 = 140 micro-USD; 1 GiB for 10 s = 45.
        assert_eq!(p.local(10_000, 10 * 1024), 185);
        assert_eq!(p.local(1, 0), 1);
        assert_eq!(p.local(0, 0), 0);
        assert_eq!(p.e2b(1000), 31);
        assert!(
            !Prices {
                cpu_second_usd: -1.0,
                ..p
            }
            .valid()
        );
    }
}
