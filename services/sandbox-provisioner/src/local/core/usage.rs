//! What a local sandbox uses: CPU time from its cgroup's counter, memory held while its
//! commands run (sampled every second), wall time since create; priced by the
//! operator's table (`crate::usage`). The agent runner charges a fork's sandbox cost to
//! the fork's reservation as the agent runs, and the fork's commit includes the final
//! figure (`CollectPatchResponse.usage`, read after the fork's last command).

use crate::local::core::{entry::Entry, provisioner::Provisioner};
use forkyard_proto::sandbox::v1::SandboxUsage;
use std::{
    sync::{Arc, Weak},
    time::Duration,
};

const SAMPLE_EVERY: Duration = Duration::from_secs(1);

impl Provisioner {
    /// `entry`'s use so far, priced.
    pub(crate) fn usage(&self, entry: &Entry) -> SandboxUsage {
        let (id, created, memory_mib_ms) = {
            let r = entry.record.lock().expect("record lock");
            (r.id.clone(), r.created_unix_ms, r.memory_mib_ms)
        };
        let cpu_ms = self
            .isolation
            .cgroups
            .as_ref()
            .filter(|_| entry.cgroups_made())
            .and_then(|cg| cg.cpu_usec(&id))
            .map_or(0, |us| us / 1000);
        let memory_mib_seconds = memory_mib_ms / 1000;
        SandboxUsage {
            cpu_ms,
            memory_mib_seconds,
            wall_ms: u64::try_from(crate::limits::now_ms() - created).unwrap_or(0),
            cost_micros: self.config.prices.local(cpu_ms, memory_mib_seconds),
        }
    }

    /// One sample of every sandbox running a command: the memory it holds, for a second.
    fn sample_memory(&self) {
        let Some(cg) = &self.isolation.cgroups else {
            return;
        };
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
