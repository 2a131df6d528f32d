//! What sandboxes' use costs: the operator's price table, which both backends charge by
//! (a local sandbox by its CPU and memory, an E2B one by its lifetime).

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
        forkyard_proto::Usd::charged(micro).micros()
    }

    pub fn e2b(&self, wall_ms: u64) -> i64 {
        let micro = wall_ms as f64 / 1000.0 * self.e2b_second_usd * 1e6;
        forkyard_proto::Usd::charged(micro).micros()
    }
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
