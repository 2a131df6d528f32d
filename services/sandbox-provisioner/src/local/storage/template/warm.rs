//! Warm copies of a template's workspace, made ahead of the creates that take them.
//!
//! A create from a template copies its workspace: a mkdir per directory, an open, a copy
//! and a close per file. That was most of the replica's CPU in a wave of a hundred
//! creates, and so most of the time from LaunchRun to a ready sandbox
//! (docs/performance.md). A warm copy is made the same way, ahead of time, by one
//! background thread at the lowest CPU priority (it uses what the machine leaves idle,
//! never a wave's time: it waits until creates have been quiet for [`QUIET`]), and a
//! create takes it with one rename.
//!
//! How many: as many as the template had creates in the last [`DEMAND_WINDOW`] (the
//! size of the waves it serves), at least [`WarmBounds::min`] (the operator's floor: a
//! first wave larger than the last minute's finds copies too), at most
//! [`WarmBounds::copies`] for a template and [`WarmBounds::bytes`] of copies in all, and
//! never more than creates can spare of what a copy holds ahead of time (`Shared::room`:
//! half the sandbox uids; with overlays, a quarter of the open-files limit). A template's
//! copies are dropped [`IDLE`]
//! after its last create, with the template (they live in its directory, `warm/`, and
//! count towards its size when templates are evicted) and at start-up.
//!
//! A copy is handed out once (taken under the lock, then renamed away), only for the
//! template it was made from (a template is one commit of one repository), and never
//! after a sandbox used it (copies are made from the template and never given back).

use super::warm_copy::{DIR, WarmCopy, make_copy};
use crate::local::{base::fs::remove_all, isolation::uids::SandboxUids, storage::overlay};
use std::{
    collections::{HashMap, VecDeque},
    path::{Path, PathBuf},
    sync::{Arc, Mutex, mpsc},
    time::{Duration, Instant},
};

/// A template's creates within this window set how many copies it keeps.
const DEMAND_WINDOW: Duration = Duration::from_secs(60);
/// A template's copies are dropped this long after its last create.
const IDLE: Duration = Duration::from_secs(600);
/// Copies are made only once no create came for this long: a wave's creates are not
/// slowed by the copies that replace the ones they take (measured: a thread at the
/// lowest priority still took a fifth of the replica's CPU in a wave).
const QUIET: Duration = Duration::from_millis(200);

/// How many warm copies a replica keeps. `copies` 0: none (every create copies).
#[derive(Debug, Clone, Copy)]
pub struct WarmBounds {
    /// At most this many copies of one template.
    pub copies: usize,
    /// At most this many bytes of copies in all.
    pub bytes: u64,
    /// At least this many copies (within the bounds) of each template a create used in
    /// the last [`IDLE`], whatever its demand; 0: as many as its demand.
    pub min: usize,
}

impl WarmBounds {
    /// `min` chosen by the replica: the whole of `copies` where copies are overlays
    /// (`crate::local::storage::overlay`: a few inodes and a mount each, none of the worktree's
    /// bytes), none where they are copies of the worktree.
    pub const MIN_AUTO: usize = usize::MAX;

    /// `min` as it applies, with or without overlays.
    #[must_use]
    pub fn resolved(self, overlays: bool) -> Self {
        let min = match self.min {
            Self::MIN_AUTO if overlays => self.copies,
            Self::MIN_AUTO => 0,
            n => n,
        };
        Self { min, ..self }
    }

    pub const OFF: Self = Self {
        copies: 0,
        bytes: 0,
        min: 0,
    };
}

pub(crate) struct Warm {
    shared: Arc<Shared>,
    /// Wakes the filler thread; `None` when warm copies are off.
    wake: Option<mpsc::Sender<()>>,
    /// Cleared when a copy cannot be renamed into a sandbox's directory (another
    /// filesystem): every create copies from then on.
    usable: std::sync::atomic::AtomicBool,
}

struct Shared {
    pools: Mutex<HashMap<PathBuf, Pool>>,
    /// Copies no template has any more, whose files are still to be removed.
    dropped: Mutex<Vec<WarmCopy>>,
    bounds: WarmBounds,
    uids: Option<Arc<SandboxUids>>,
    /// Set when the replica's workspaces are overlays: the copies made are too.
    overlays: std::sync::OnceLock<Arc<overlay::Overlays>>,
}

/// One template's copies, by the template's directory.
#[derive(Default)]
struct Pool {
    copies: Vec<WarmCopy>,
    /// Its creates within the last [`DEMAND_WINDOW`].
    creates: VecDeque<Instant>,
    last_create: Option<Instant>,
    /// The size of one copy (the template's), once known.
    bytes: u64,
}

enum Job {
    Make(PathBuf),
    Drop(Vec<WarmCopy>),
    /// Copies are wanted, once creates have been quiet this much longer.
    Wait(Duration),
}

impl Warm {
    /// The replica's sandbox uids, when it hands them out.
    pub(crate) fn uids(&self) -> Option<&Arc<SandboxUids>> {
        self.shared.uids.as_ref()
    }

    /// Warm copies within `bounds`, made by a thread of their own (none when off).
    pub(crate) fn start(bounds: WarmBounds, uids: Option<Arc<SandboxUids>>) -> Self {
        let shared = Arc::new(Shared {
            pools: Mutex::default(),
            dropped: Mutex::default(),
            bounds,
            uids,
            overlays: std::sync::OnceLock::new(),
        });
        let usable = std::sync::atomic::AtomicBool::new(true);
        if bounds.copies == 0 || bounds.bytes == 0 {
            return Self {
                shared,
                wake: None,
                usable,
            };
        }
        let (tx, rx) = mpsc::channel();
        let filler = shared.clone();
        let started = std::thread::Builder::new()
            .name("warm-copies".into())
            .spawn(move || filler.fill(&rx))
            .inspect_err(|e| tracing::warn!(error = %e, "cannot start the warm copy thread; every create copies its template"))
            .ok();
        Self {
            shared,
            wake: started.map(|_| tx),
            usable,
        }
    }

    /// Make overlays (`crate::local::storage::overlay`) instead of copies from now on.
    pub(crate) fn make_overlays(&self, overlays: Arc<overlay::Overlays>) {
        let _ = self.shared.overlays.set(overlays);
    }

    /// A copy of the template at `template` (its directory), if one is ready; counts
    /// the create either way, and has the thread make more.
    pub(crate) fn take(&self, template: &Path) -> Option<WarmCopy> {
        let wake = self.wake.as_ref()?;
        if !self.usable.load(std::sync::atomic::Ordering::Relaxed) {
            return None;
        }
        let copy = {
            let mut pools = self.shared.pools.lock().expect("warm lock");
            let pool = pools.entry(template.to_path_buf()).or_default();
            let now = Instant::now();
            pool.creates.push_back(now);
            pool.last_create = Some(now);
            trim(&mut pool.creates, now);
            let copy = pool.copies.pop();
            publish(&pools);
            copy
        };
        let _ = wake.send(());
        copy
    }

    /// A copy could not be renamed into a sandbox (`error`): it is removed, and when the
    /// sandboxes are on another filesystem than the templates, no more copies are made.
    pub(crate) fn unusable(&self, copy: &WarmCopy, error: &std::io::Error) {
        let _ = remove_all(&copy.path);
        if error.kind() == std::io::ErrorKind::CrossesDevices {
            tracing::warn!(error = %error, "warm copies cannot be renamed into sandboxes (another filesystem); every create copies its template");
            self.usable
                .store(false, std::sync::atomic::Ordering::Relaxed);
            // Their files too, by the copying thread (a create waits on this one).
            let copies: Vec<WarmCopy> = {
                let mut pools = self.shared.pools.lock().expect("warm lock");
                let copies = pools.drain().flat_map(|(_, p)| p.copies).collect();
                publish(&pools);
                copies
            };
            self.shared
                .dropped
                .lock()
                .expect("warm lock")
                .extend(copies);
            if let Some(wake) = &self.wake {
                let _ = wake.send(());
            }
        } else {
            tracing::debug!(copy = %copy.path.display(), error = %error, "warm copy not usable; copying the template");
        }
    }

    /// The template at `template` is going away: its copies go with its directory.
    pub(crate) fn forget(&self, template: &Path) {
        let mut pools = self.shared.pools.lock().expect("warm lock");
        pools.remove(template);
        publish(&pools);
    }

    /// How many copies are ready, over all templates.
    #[cfg(test)]
    pub(crate) fn ready(&self) -> usize {
        let pools = self.shared.pools.lock().expect("warm lock");
        pools.values().map(|p| p.copies.len()).sum()
    }
}

/// The copies ready over all templates, for `/metrics` (`sandbox_warm_copies`).
fn publish(pools: &HashMap<PathBuf, Pool>) {
    let ready: usize = pools.values().map(|p| p.copies.len()).sum();
    crate::metrics::warm_copies_ready(ready);
}

/// How many descriptors warm overlays may hold: a quarter of the open-files limit (the
/// provisioner's, raised to its hard limit at start-up).
fn descriptors_for_overlays() -> usize {
    let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile).current;
    limit.map_or(usize::MAX, |n| usize::try_from(n / 4).unwrap_or(usize::MAX))
}

fn trim(creates: &mut VecDeque<Instant>, now: Instant) {
    while creates
        .front()
        .is_some_and(|t| now.duration_since(*t) > DEMAND_WINDOW)
    {
        creates.pop_front();
    }
}

impl Shared {
    fn fill(&self, wake: &mpsc::Receiver<()>) {
        // This thread alone: copies are made with what the machine leaves idle.
        let _ = rustix::process::setpriority_process(None, 19);
        loop {
            match wake.recv_timeout(Duration::from_secs(60)) {
                Ok(()) | Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => return,
            }
            while wake.try_recv().is_ok() {}
            while let Some(job) = self.next_job(Instant::now()) {
                match job {
                    Job::Make(template) => self.make(&template),
                    Job::Wait(quiet) => std::thread::sleep(quiet),
                    Job::Drop(copies) => {
                        for c in copies {
                            let _ = remove_all(&c.path);
                        }
                    }
                }
            }
        }
    }

    /// Idle templates' copies to drop first, then a copy some template lacks.
    fn next_job(&self, now: Instant) -> Option<Job> {
        let dropped = std::mem::take(&mut *self.dropped.lock().expect("warm lock"));
        if !dropped.is_empty() {
            return Some(Job::Drop(dropped));
        }
        let mut pools = self.pools.lock().expect("warm lock");
        let idle = pools
            .iter()
            .find(|(_, p)| p.last_create.is_none_or(|t| now.duration_since(t) > IDLE))
            .map(|(k, _)| k.clone());
        if let Some(key) = idle {
            let pool = pools.remove(&key).expect("found above");
            publish(&pools);
            return Some(Job::Drop(pool.copies));
        }
        let in_all: u64 = pools
            .values()
            .map(|p| p.bytes * p.copies.len() as u64)
            .sum();
        let copies: usize = pools.values().map(|p| p.copies.len()).sum();
        if !self.room(copies) {
            return None;
        }
        let last_create = pools.values().filter_map(|p| p.last_create).max();
        for (key, pool) in pools.iter_mut() {
            trim(&mut pool.creates, now);
            let wanted = pool
                .creates
                .len()
                .max(self.bounds.min)
                .min(self.bounds.copies);
            if pool.copies.len() < wanted && in_all + pool.bytes <= self.bounds.bytes {
                let quiet = last_create.map_or(QUIET, |t| now.duration_since(t));
                return Some(match QUIET.checked_sub(quiet) {
                    Some(wait) if !wait.is_zero() => Job::Wait(wait),
                    _ => Job::Make(key.clone()),
                });
            }
        }
        None
    }

    /// Whether one more copy leaves creates what copies hold too: a copy claims its
    /// sandbox uid ahead of time, so copies stop at half the replica's uids; and an
    /// overlay holds a descriptor (its mount), so overlays stop at a quarter of the
    /// open-files limit. Without these a replica serving many repositories at once
    /// (a floor of `copies` each) had its creates refused for want of a uid, or of a
    /// descriptor.
    fn room(&self, copies: usize) -> bool {
        if self.uids.as_ref().is_some_and(|u| u.half_used()) {
            return false;
        }
        self.overlays.get().is_none() || copies < descriptors_for_overlays()
    }

    /// One more copy of `template`; a template that cannot be copied (evicted, or
    /// replaced by a newer commit's) is forgotten.
    fn make(&self, template: &Path) {
        match make_copy(template, self.uids.as_ref(), self.overlays.get()) {
            Ok((copy, bytes)) => {
                let mut pools = self.pools.lock().expect("warm lock");
                match pools.get_mut(template) {
                    Some(pool) => {
                        pool.bytes = bytes;
                        pool.copies.push(copy);
                        publish(&pools);
                    }
                    // Forgotten meanwhile: its directory is going away.
                    None => drop(remove_all(&copy.path)),
                }
            }
            Err(e) => {
                tracing::debug!(template = %template.display(), error = %e, "no warm copy of the template");
                let mut pools = self.pools.lock().expect("warm lock");
                pools.remove(template);
                publish(&pools);
            }
        }
    }
}

/// Copies a previous run of the replica made: nothing knows of them any more.
pub(crate) fn sweep(template: &Path) {
    let _ = remove_all(&template.join(DIR));
}
