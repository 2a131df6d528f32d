//! A sandbox as the running provisioner tracks it: its record and its running commands.

use crate::local::{
    isolation::{
        init::host::Init,
        network::{llm_relay, llm_relay::Relay},
    },
    storage::store::Record,
};
use forkyard_proto::sandbox::v1::Sandbox;
use std::sync::{
    Arc, Mutex,
    atomic::{AtomicBool, Ordering},
};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

pub(crate) struct Entry {
    pub(crate) record: Mutex<Record>,
    pub(crate) execs: watch::Sender<ExecState>,
    /// Fired by destroy: every running exec kills its process, the egress proxy stops.
    pub(crate) cancel: CancellationToken,
    /// A child of `cancel`, fired (and replaced) by stop: running execs die.
    stop: Mutex<CancellationToken>,
    /// Its cgroups exist with its limits (made before its first command, not at create).
    cgroups_made: AtomicBool,
    /// Its running init, when its commands run under one (`crate::local::isolation::init`).
    pub(crate) init: Mutex<Option<InitSession>>,
    /// The LLM gateway of its running LLM commands (under an init: one relay for all).
    pub(crate) llm: Arc<llm_relay::LlmSlot>,
}

/// A sandbox's init as the provisioner keeps it (`crate::local::core::sandbox_init`), with the
/// one LLM relay the sandbox's commands share while it runs.
pub(crate) struct InitSession {
    pub(crate) init: Arc<Init>,
    /// Stopped (its socket removed) with the session.
    _llm_relay: Relay,
}

impl InitSession {
    pub(crate) fn new(init: Arc<Init>, llm_relay: Relay) -> Self {
        Self {
            init,
            _llm_relay: llm_relay,
        }
    }
}

#[derive(Debug, Default)]
pub(crate) struct ExecState {
    pub(crate) destroying: bool,
    pub(crate) running: u32,
}

impl Entry {
    pub(crate) fn new(record: Record) -> Arc<Self> {
        let destroying = record.destroying;
        let cancel = CancellationToken::new();
        Arc::new(Self {
            record: Mutex::new(record),
            execs: watch::Sender::new(ExecState {
                destroying,
                running: 0,
            }),
            stop: Mutex::new(cancel.child_token()),
            cancel,
            cgroups_made: AtomicBool::new(false),
            init: Mutex::new(None),
            llm: Arc::default(),
        })
    }

    pub(crate) fn cgroups_made(&self) -> bool {
        self.cgroups_made.load(Ordering::Acquire)
    }

    pub(crate) fn set_cgroups_made(&self) {
        self.cgroups_made.store(true, Ordering::Release);
    }

    /// The token a new exec watches: stop or destroy kill it.
    pub(crate) fn exec_cancel(&self) -> CancellationToken {
        self.stop.lock().expect("stop lock").clone()
    }

    /// Kill every running exec (a fresh token for the ones started afterwards) and the
    /// sandbox's init with everything left in the sandbox.
    pub(crate) fn stop_execs(&self) {
        let mut stop = self.stop.lock().expect("stop lock");
        stop.cancel();
        *stop = self.cancel.child_token();
        drop(stop);
        self.end_init();
    }

    /// Kill the sandbox's init (its bubblewrap, and every process in the sandbox); the
    /// next command starts a new one.
    pub(crate) fn end_init(&self) {
        let session = self.init.lock().expect("init lock").take();
        if let Some(s) = session {
            s.init.shutdown();
        }
    }

    pub(crate) fn snapshot(&self) -> Sandbox {
        let running = self.execs.borrow().running;
        self.record.lock().expect("record lock").to_proto(running)
    }

    pub(crate) fn record(&self) -> Record {
        self.record.lock().expect("record lock").clone()
    }

    /// Count a new exec, unless the sandbox is being destroyed.
    pub(crate) fn begin_exec(self: &Arc<Self>) -> Option<ExecGuard> {
        let mut admitted = false;
        self.execs.send_modify(|s| {
            if !s.destroying {
                s.running += 1;
                admitted = true;
            }
        });
        admitted.then(|| ExecGuard(self.clone()))
    }
}

/// Counts one running exec; dropping it (also when the caller hung up) uncounts it.
pub(crate) struct ExecGuard(Arc<Entry>);

impl Drop for ExecGuard {
    fn drop(&mut self) {
        self.0.execs.send_modify(|s| s.running -= 1);
    }
}
