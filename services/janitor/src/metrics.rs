//! What the janitor counts, by reason: reaped sandboxes and released reservations.

use prometheus::{IntCounter, IntCounterVec, Opts, Registry};

#[derive(Clone)]
pub struct SweepMetrics {
    reaped: IntCounterVec,
    released: IntCounterVec,
    sweeps: IntCounter,
}

/// A reason's stable label value (the report's reason text carries the details).
pub fn reason_label(reason: &str) -> &'static str {
    if reason.starts_with("workflow closed") || reason.starts_with("holder workflow closed") {
        "workflow_closed"
    } else if reason.contains("workflow not found") {
        "workflow_not_found"
    } else if reason == "no owner label" {
        "no_owner"
    } else if reason.starts_with("older than max age") {
        "max_age"
    } else if reason.starts_with("provisioner TTL") {
        "ttl"
    } else if reason.starts_with("owner has not heartbeat") {
        "heartbeat_lost"
    } else {
        "other"
    }
}

impl SweepMetrics {
    pub fn register(registry: &Registry) -> Result<Self, prometheus::Error> {
        let reaped = IntCounterVec::new(
            Opts::new(
                "janitor_sandboxes_reaped_total",
                "Orphaned sandboxes destroyed, by reason",
            ),
            &["reason"],
        )?;
        let released = IntCounterVec::new(
            Opts::new(
                "janitor_reservations_released_total",
                "Stale reservations released, by reason",
            ),
            &["reason"],
        )?;
        let sweeps = IntCounter::new("janitor_sweeps_total", "Sweeps run (dry runs included)")?;
        registry.register(Box::new(reaped.clone()))?;
        registry.register(Box::new(released.clone()))?;
        registry.register(Box::new(sweeps.clone()))?;
        Ok(Self {
            reaped,
            released,
            sweeps,
        })
    }

    pub fn sweep(&self) {
        self.sweeps.inc();
    }

    pub fn reaped(&self, reason: &str) {
        self.reaped.with_label_values(&[reason_label(reason)]).inc();
    }

    pub fn released(&self, reason: &str) {
        self.released
            .with_label_values(&[reason_label(reason)])
            .inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_map_to_few_stable_labels() {
        assert_eq!(
            reason_label("workflow closed: TERMINATED"),
            "workflow_closed"
        );
        assert_eq!(
            reason_label("holder workflow not found"),
            "workflow_not_found"
        );
        assert_eq!(reason_label("older than max age (60 s)"), "max_age");
        assert_eq!(
            reason_label("owner has not heartbeat for 700 s"),
            "heartbeat_lost"
        );
    }
}
