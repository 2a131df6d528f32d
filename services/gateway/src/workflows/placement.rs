//! Where each fork of a run over several backends goes (`RunSpec.backends`,
//! [`Change::SeveralBackends`](super::patches::Change)).
//!
//! A backend's share is counted as the forks *in flight* on it: placed there and not yet
//! ended (creating, running its agent, verifying, settling). That is what a share limits
//! in practice, sandboxes alive at once on that backend (a quota of concurrent E2B
//! sandboxes, the cores of the local hosts), and it is known from the run's own state
//! alone, so the choice is a function of the history and replays the same. A count of
//! forks ever placed would instead overflow for good after the first few, and leave the
//! first backend idle once they finished.
//!
//! Forks fill the first backend with room, in the list's order; while none has room,
//! none starts (the run's `max_concurrent` bounds them all as before). A create the
//! backend itself refuses moves the fork to the next backend after it with room
//! ([`SandboxOrchestrationWorkflow::move_on`]), never back to an earlier one: the list
//! is the caller's order of preference, and an earlier one's share is full or it failed.
//!
//! When none after it has room, the fork waits for room there
//! ([`SandboxOrchestrationWorkflow::wait_for_room`], [`Change::RefusedForkWaits`]): it
//! gives back its reservation, is pending again with a floor (the first backend it may
//! still go to), and starts as soon as a fork in flight on one of those ends. Runs of
//! earlier builds failed it once their wave's retry rounds (about three minutes) were
//! over, however long the forks ahead of it ran.
//!
//! [`Change::RefusedForkWaits`]: super::patches::Change::RefusedForkWaits

use super::run_state::SandboxOrchestrationWorkflow;
use forkyard_proto::common::v1::ForkStatus;

impl SandboxOrchestrationWorkflow {
    /// Forks in flight on `backend`.
    fn in_flight_on(&self, backend: &str) -> u32 {
        self.forks
            .iter()
            .filter(|f| f.status == ForkStatus::Running as i32 && f.backend == backend)
            .count() as u32
    }

    /// Whether the run's `i`th backend may take one more fork (a share of 0: no limit).
    fn has_room(&self, i: usize) -> bool {
        let b = &self.spec.backends[i];
        b.max_concurrent == 0 || self.in_flight_on(&b.name) < b.max_concurrent
    }

    /// The next pending fork that some backend has room for, in fork order, marked
    /// running and placed there: (fork, attempt, backend). A fork waiting for room on a
    /// later backend does not hold back the forks after it that may go to an earlier one.
    /// Without floors this is the first pending fork on the first backend with room.
    /// Each backend's room is counted once a call (a count walks every fork: once per
    /// pending fork it would cost a large run's every start its forks squared).
    pub(super) fn next_placed(&mut self) -> Option<(u32, u32, String)> {
        if !self.may_start() {
            return None;
        }
        let rooms: Vec<bool> = (0..self.spec.backends.len())
            .map(|i| self.has_room(i))
            .collect();
        let first = rooms.iter().position(|r| *r)?;
        let (fork, at) = self
            .forks
            .iter()
            .filter(|f| f.status == ForkStatus::Pending as i32)
            .find_map(|f| {
                let floor = self
                    .floors
                    .get(&f.fork)
                    .map_or(first, |fl| (*fl).max(first));
                (floor..rooms.len())
                    .find(|&i| rooms[i])
                    .map(|at| (f.fork, at))
            })?;
        let attempt = self.begin(fork);
        let name = self.spec.backends[at].name.clone();
        self.place(fork, &name);
        Some((fork, attempt, name))
    }

    /// `fork` goes to `backend`: it counts there from now until it ends, and its result
    /// says so before it has a sandbox.
    pub(super) fn place(&mut self, fork: u32, backend: &str) {
        if let Some(f) = self.slot_mut(fork) {
            backend.clone_into(&mut f.backend);
        }
    }

    /// `fork`'s create was refused by `from`: the next backend after it with room, now
    /// counting the fork; `None` when there is none (the fork keeps the refusal).
    pub(super) fn move_on(&mut self, fork: u32, from: &str) -> Option<String> {
        let at = self.spec.backends.iter().position(|b| b.name == from)?;
        let next = (at + 1..self.spec.backends.len()).find(|&i| self.has_room(i))?;
        let name = self.spec.backends[next].name.clone();
        self.place(fork, &name);
        Some(name)
    }

    /// `fork`'s create was refused by `from` and no backend after it has room: it is to
    /// wait for room on those (its floor), if there are any. `Some`: the backends it
    /// waits for, as the fork's result names them.
    pub(super) fn wait_for_room(&mut self, fork: u32, from: &str) -> Option<String> {
        let at = self.spec.backends.iter().position(|b| b.name == from)?;
        let later = self.spec.backends.get(at + 1..).filter(|l| !l.is_empty())?;
        let names: Vec<&str> = later.iter().map(|b| b.name.as_str()).collect();
        self.floors.insert(fork, at + 1);
        Some(names.join(" or "))
    }

    /// A fork that waits for room ([`Self::wait_for_room`]) is pending again, on no
    /// backend, saying why.
    pub(super) fn pend_for_room(&mut self, fork: u32, why: String) {
        if let Some(f) = self.slot_mut(fork) {
            f.status = ForkStatus::Pending as i32;
            f.phase = super::phase::WAITING_FOR_ROOM.into();
            f.backend.clear();
            f.sandbox_id.clear();
            f.error = why;
        }
    }

    /// The backend `fork` was placed on ("" for a run of one backend).
    pub(super) fn placed_on(&self, fork: u32) -> String {
        fork.checked_sub(1)
            .and_then(|i| self.forks.get(i as usize))
            .map(|f| f.backend.clone())
            .unwrap_or_default()
    }

    fn slot_mut(&mut self, fork: u32) -> Option<&mut forkyard_proto::common::v1::ForkResult> {
        fork.checked_sub(1)
            .and_then(|i| self.forks.get_mut(i as usize))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use forkyard_proto::gateway::v1::{BackendShare, RunSpec};

    fn run(shares: &[(&str, u32)], forks: u32) -> SandboxOrchestrationWorkflow {
        SandboxOrchestrationWorkflow::starting(RunSpec {
            forks,
            backends: shares
                .iter()
                .map(|(n, m)| BackendShare {
                    name: (*n).into(),
                    max_concurrent: *m,
                })
                .collect(),
            ..Default::default()
        })
    }

    /// Start the next fork where there is room, as the run loop does.
    fn start(s: &mut SandboxOrchestrationWorkflow) -> Option<(u32, String)> {
        s.next_placed().map(|(fork, _, b)| (fork, b))
    }

    fn end(s: &mut SandboxOrchestrationWorkflow, fork: u32) {
        s.forks[(fork - 1) as usize].status = ForkStatus::Succeeded as i32;
    }

    #[test]
    fn forks_fill_the_first_backend_up_to_its_share_then_the_rest() {
        let mut s = run(&[("local", 2), ("e2b", 0)], 5);
        let placed: Vec<String> = (0..5).filter_map(|_| start(&mut s)).map(|p| p.1).collect();
        assert_eq!(placed, ["local", "local", "e2b", "e2b", "e2b"]);
    }

    #[test]
    fn a_share_counts_forks_in_flight_so_a_finished_one_frees_its_place() {
        let mut s = run(&[("local", 1), ("e2b", 1)], 4);
        assert_eq!(start(&mut s), Some((1, "local".into())));
        assert_eq!(start(&mut s), Some((2, "e2b".into())));
        assert_eq!(start(&mut s), None, "every share is full: nothing starts");
        end(&mut s, 1);
        assert_eq!(start(&mut s), Some((3, "local".into())));
    }

    #[test]
    fn a_refused_fork_moves_to_the_next_backend_with_room_never_back() {
        let mut s = run(&[("e2b", 2), ("local", 1)], 3);
        assert_eq!(start(&mut s), Some((1, "e2b".into())));
        assert_eq!(start(&mut s), Some((2, "e2b".into())));
        assert_eq!(start(&mut s), Some((3, "local".into())));
        // e2b refuses fork 1: local is full (fork 3), so it has nowhere to go.
        assert_eq!(s.move_on(1, "e2b"), None);
        end(&mut s, 3);
        assert_eq!(s.move_on(1, "e2b"), Some("local".into()));
        assert_eq!(s.placed_on(1), "local");
        // From the last backend there is no next one.
        assert_eq!(s.move_on(1, "local"), None);
    }

    #[test]
    fn a_refused_fork_with_no_room_after_waits_for_it_and_lets_others_pass() {
        let mut s = run(&[("e2b", 2), ("local", 1)], 4);
        assert_eq!(start(&mut s), Some((1, "e2b".into())));
        assert_eq!(start(&mut s), Some((2, "e2b".into())));
        assert_eq!(start(&mut s), Some((3, "local".into())));
        // e2b refuses fork 1; local is full: it waits for room there, pending.
        assert_eq!(s.move_on(1, "e2b"), None);
        assert_eq!(s.wait_for_room(1, "e2b"), Some("local".into()));
        s.pend_for_room(
            1,
            "e2b refused its create; waiting for room on local".into(),
        );
        assert_eq!(s.forks[0].status, ForkStatus::Pending as i32);
        assert_eq!(s.forks[0].phase, crate::workflows::phase::WAITING_FOR_ROOM);
        assert_eq!(s.placed_on(1), "", "it is on no backend while it waits");
        // e2b has room again: fork 4 goes there, fork 1 does not go back to it.
        assert_eq!(start(&mut s), Some((4, "e2b".into())));
        assert_eq!(start(&mut s), None, "fork 1 waits: local is full");
        end(&mut s, 3);
        let (fork, attempt, b) = s.next_placed().unwrap();
        assert_eq!((fork, b.as_str()), (1, "local"));
        assert_eq!(attempt, 2, "a new start: its steps get keys of their own");
        // Refused on the last backend there is nothing after it to wait for.
        assert_eq!(s.wait_for_room(1, "local"), None);
    }

    #[test]
    fn without_floors_the_choice_is_what_runs_of_earlier_builds_made() {
        // Generation 8 took the first backend with room, then the first pending fork.
        let mut s = run(&[("local", 1), ("e2b", 1)], 3);
        s.forks[0].status = ForkStatus::Cancelled as i32;
        assert_eq!(start(&mut s), Some((2, "local".into())));
        assert_eq!(start(&mut s), Some((3, "e2b".into())));
        assert_eq!(start(&mut s), None);
    }
}
