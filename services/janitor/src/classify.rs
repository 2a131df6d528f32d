//! Deciding, without any I/O, what the janitor does with one sandbox.

use forkyard_proto::labels;
use std::collections::HashMap;

/// What Temporal says about the workflow a sandbox belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WorkflowState {
    /// Running (or paused): the sandbox is in use.
    Running,
    /// Running, but its agent activity has been started and silent (no heartbeat) for
    /// this many seconds: its owner may be gone.
    Silent(u64),
    /// Closed with this status, e.g. `COMPLETED`, `FAILED`, `TERMINATED`.
    Closed(String),
    /// Temporal does not know the workflow (never existed or past retention).
    NotFound,
    /// Temporal answered with a status the janitor does not understand; never destroy.
    Unknown,
}

/// Who owns a sandbox, as far as the janitor could find out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Owner {
    /// No `forkyard.workflow_id` label.
    NoLabel,
    Workflow(WorkflowState),
}

/// The janitor's decision for one sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Keep,
    /// Younger than `min_age_secs`: its creation may still be in flight.
    TooYoung,
    /// Destroy it; the reason is reported and logged.
    Orphan(String),
}

/// The owning workflow id from a sandbox's labels; a blank value counts as no label.
pub fn owner_workflow_id(labels: &HashMap<String, String>) -> Option<&str> {
    labels
        .get(labels::WORKFLOW_ID)
        .map(|s| s.trim())
        .filter(|s| !s.is_empty())
}

/// The run to ask about a sandbox whose own (fork) workflow Temporal does not know: the
/// run workflow creates and checks a fork's sandbox before it starts the fork's
/// workflow, so while that run is running the sandbox is being prepared, not orphaned.
pub fn preparing_run<'a>(labels: &'a HashMap<String, String>, owner: &str) -> Option<&'a str> {
    labels
        .get(labels::RUN_ID)
        .map(|s| s.trim())
        .filter(|run| !run.is_empty() && *run != owner)
}

/// Whether a sandbox created at `created_unix_ms` is younger than `min_age_secs` at
/// `now_unix_ms`. An unknown creation time (0) counts as old.
pub fn too_young(created_unix_ms: i64, now_unix_ms: i64, min_age_secs: u32) -> bool {
    if min_age_secs == 0 || created_unix_ms <= 0 {
        return false;
    }
    now_unix_ms.saturating_sub(created_unix_ms) < i64::from(min_age_secs) * 1000
}

/// Whether a sandbox outlived the sweep's max age (0: no limit). An unknown creation
/// time never counts as too old: the owner rules decide then.
pub fn too_old(created_unix_ms: i64, now_unix_ms: i64, max_age_secs: u32) -> bool {
    max_age_secs > 0
        && created_unix_ms > 0
        && now_unix_ms.saturating_sub(created_unix_ms) > i64::from(max_age_secs) * 1000
}

/// Default grace before a silent owner makes its sandbox an orphan: far beyond the agent
/// activity's 20 s heartbeat timeout, after which Temporal itself would retry it.
pub const DEFAULT_HEARTBEAT_GRACE_SECS: u32 = 600;

/// The verdict for a sandbox old enough to consider, given its owner and how long an
/// owner may go without a heartbeat.
pub fn classify(owner: &Owner, heartbeat_grace_secs: u32) -> Verdict {
    match owner {
        Owner::Workflow(WorkflowState::Silent(secs)) if *secs > u64::from(heartbeat_grace_secs) => {
            Verdict::Orphan(format!("owner has not heartbeat for {secs} s"))
        }
        Owner::Workflow(WorkflowState::Silent(_)) => Verdict::Keep,
        Owner::NoLabel => Verdict::Orphan("no owner label".into()),
        Owner::Workflow(WorkflowState::NotFound) => Verdict::Orphan("workflow not found".into()),
        Owner::Workflow(WorkflowState::Closed(status)) => {
            Verdict::Orphan(format!("workflow closed: {status}"))
        }
        Owner::Workflow(WorkflowState::Running | WorkflowState::Unknown) => Verdict::Keep,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn a_silent_owner_is_an_orphan_only_past_the_grace() {
        let silent = |s| Owner::Workflow(WorkflowState::Silent(s));
        assert_eq!(classify(&silent(30), 600), Verdict::Keep);
        assert_eq!(
            classify(&silent(601), 600),
            Verdict::Orphan("owner has not heartbeat for 601 s".into())
        );
    }

    #[test]
    fn a_fork_sandbox_names_its_run_to_ask_while_its_workflow_is_unknown() {
        let l = labels(&[
            ("forkyard.run_id", "run-1"),
            ("forkyard.workflow_id", "run-1/fork-2"),
        ]);
        assert_eq!(preparing_run(&l, "run-1/fork-2"), Some("run-1"));
        assert_eq!(preparing_run(&l, "run-1"), None, "the run is the owner");
        assert_eq!(preparing_run(&labels(&[]), "run-1/fork-2"), None);
        assert_eq!(
            preparing_run(&labels(&[("forkyard.run_id", " ")]), "x"),
            None
        );
    }

    #[test]
    fn max_age_table() {
        let now = 10_000_000;
        assert!(too_old(now - 3_601_000, now, 3600));
        assert!(!too_old(now - 3_599_000, now, 3600));
        assert!(!too_old(now - 99_999_000, now, 0), "0 means no limit");
        assert!(!too_old(0, now, 60), "unknown creation time");
    }

    #[test]
    fn verdict_table() {
        let orphan = |s: &str| Verdict::Orphan(s.to_owned());
        let cases = [
            (Owner::NoLabel, orphan("no owner label")),
            (
                Owner::Workflow(WorkflowState::NotFound),
                orphan("workflow not found"),
            ),
            (
                Owner::Workflow(WorkflowState::Closed("COMPLETED".into())),
                orphan("workflow closed: COMPLETED"),
            ),
            (
                Owner::Workflow(WorkflowState::Closed("TERMINATED".into())),
                orphan("workflow closed: TERMINATED"),
            ),
            (
                Owner::Workflow(WorkflowState::Closed("FAILED".into())),
                orphan("workflow closed: FAILED"),
            ),
            (Owner::Workflow(WorkflowState::Running), Verdict::Keep),
            (Owner::Workflow(WorkflowState::Unknown), Verdict::Keep),
        ];
        for (owner, want) in cases {
            assert_eq!(classify(&owner, 600), want, "{owner:?}");
        }
    }

    #[test]
    fn owner_label_table() {
        type Labels<'a> = &'a [(&'a str, &'a str)];
        let cases: [(Labels, Option<&str>); 5] = [
            (&[], None),
            (&[("forkyard.run_id", "r1")], None),
            (&[("forkyard.workflow_id", "")], None),
            (&[("forkyard.workflow_id", "  ")], None),
            (
                &[
                    ("forkyard.workflow_id", "fork-r1-2"),
                    ("forkyard.run_id", "r1"),
                ],
                Some("fork-r1-2"),
            ),
        ];
        for (pairs, want) in cases {
            assert_eq!(owner_workflow_id(&labels(pairs)), want, "{pairs:?}");
        }
    }

    #[test]
    fn age_table() {
        let now = 1_000_000;
        // (created, min_age_secs, too young)
        let cases = [
            (now, 0, false),
            (now - 5_000, 10, true),
            (now - 9_999, 10, true),
            (now - 10_000, 10, false),
            (now - 60_000, 10, false),
            (0, 10, false),
            (now + 5_000, 10, true), // clock skew: created "in the future"
        ];
        for (created, min_age, want) in cases {
            assert_eq!(
                too_young(created, now, min_age),
                want,
                "created {created} min_age {min_age}"
            );
        }
    }
}
