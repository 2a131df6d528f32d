//! What a run keeps of each fork in its own history, from its spec alone (so a replay
//! computes the same): inline forks' patches and output tails are events of the run, and
//! Temporal warns at 10 MiB of history. Used by the fork's steps wherever they run.

/// The largest patch an inline fork of a run of up to [`SMALL_RUN`] forks keeps in the
/// run's history.
pub(super) const PATCH_MAX_BYTES: u64 = 16 * 1024;
/// Runs of up to this many inline forks keep what they always kept of each in their
/// history; larger ones share [`LARGE_RUN_BYTES`].
const SMALL_RUN: u32 = 300;
/// What a larger run keeps of its forks in its history, all forks together: patches,
/// agent output tails, verify output tails. About 7.5 MiB with every fork at its caps
/// (and each fork's own events), below Temporal's 10 MiB history warning.
const LARGE_RUN_BYTES: HistoryCaps = HistoryCaps {
    patch: 3 << 20,
    agent_tail: 3 << 19,
    verify_tail: 3 << 18,
};

/// The most of each fork a run keeps in its history: its patch (a larger one is handed
/// to a child, which keeps it in its own), the agent's output tail (stdout's and
/// stderr's together) and each of verify's two output tails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct HistoryCaps {
    pub patch: u64,
    /// 0: the runner's default (8 KiB).
    pub agent_tail: u32,
    pub verify_tail: u32,
}

/// A run's caps, from its spec alone (so a replay computes the same ones). Runs of up to
/// [`SMALL_RUN`] forks, and forks in children of their own, get what every run got
/// before larger inline runs existed; the verify tail was never kept longer than 4 KiB.
pub(super) fn history_caps(spec: &forkyard_proto::gateway::v1::RunSpec) -> HistoryCaps {
    let small = HistoryCaps {
        patch: PATCH_MAX_BYTES,
        agent_tail: 0,
        verify_tail: 4096,
    };
    if !spec.inline_forks || spec.forks <= SMALL_RUN {
        return small;
    }
    let share = |total: u64, floor: u64| (total / u64::from(spec.forks)).max(floor);
    HistoryCaps {
        patch: share(LARGE_RUN_BYTES.patch, 2048).min(small.patch),
        agent_tail: u32::try_from(share(LARGE_RUN_BYTES.agent_tail.into(), 512)).unwrap_or(512),
        // Two streams.
        verify_tail: u32::try_from(share(LARGE_RUN_BYTES.verify_tail.into(), 512) / 2)
            .unwrap_or(256),
    }
}

#[cfg(test)]
mod tests {
    use super::{HistoryCaps, PATCH_MAX_BYTES, history_caps};
    use forkyard_proto::gateway::v1::RunSpec;

    fn spec(forks: u32, inline_forks: bool) -> RunSpec {
        RunSpec {
            forks,
            inline_forks,
            ..Default::default()
        }
    }

    #[test]
    fn runs_up_to_300_forks_keep_what_they_always_kept_and_larger_ones_share() {
        let small = HistoryCaps {
            patch: PATCH_MAX_BYTES,
            agent_tail: 0,
            verify_tail: 4096,
        };
        assert_eq!(history_caps(&spec(1, true)), small);
        assert_eq!(history_caps(&spec(300, true)), small);
        // Forks in children keep their patches and outputs in their own histories.
        assert_eq!(history_caps(&spec(1000, false)), small);
        for forks in [301, 1000, 1300] {
            let c = history_caps(&spec(forks, true));
            assert!(
                c.patch < PATCH_MAX_BYTES && c.patch >= 2048,
                "{forks}: {c:?}"
            );
            assert!(c.agent_tail >= 512 && c.agent_tail < 8192, "{forks}: {c:?}");
            assert!(
                c.verify_tail >= 256 && c.verify_tail < 4096,
                "{forks}: {c:?}"
            );
            // Every fork at its caps, and 2 KiB of its own events beside: below 10 MiB.
            let per_fork = c.patch + u64::from(c.agent_tail) + 2 * u64::from(c.verify_tail) + 2048;
            assert!(
                per_fork * u64::from(forks) < 10 << 20,
                "{forks}: {per_fork} a fork"
            );
        }
    }
}
