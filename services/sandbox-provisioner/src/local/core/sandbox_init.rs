//! A sandbox's init as the provisioner keeps it: started at the sandbox's first command
//! (again after a stop, a provisioner restart, or an init that went away), or for a
//! gVisor sandbox as soon as it is made ([`Provisioner::boot_in_background`]), with the
//! one LLM relay the sandbox's commands share while it runs.

use crate::{
    error::{ProvisionerError, Result},
    local::{
        core::{
            entry::{Entry, InitSession},
            prepare,
            provisioner::Provisioner,
        },
        isolation::{
            Kind,
            bubblewrap::bwrap::{ImageRoot, Invocation, Relays},
            gvisor::layout::Layout,
            init::host::Init,
            network::{forwarder_kit::ForwarderKit, llm_relay, llm_relay::Relay},
        },
        storage::store::Record,
    },
};
use std::{path::Path, sync::Arc};

impl Provisioner {
    /// Whether a command with these tools runs under the sandbox's init: the init is the
    /// forwarder, and runs on the sandbox's root, where the provisioner's own steps on an
    /// image (which need the host's /usr) cannot run.
    pub(crate) fn runs_under_init(&self, record: &Record, tools: prepare::Tools) -> bool {
        // gVisor's sandbox is its init's container: only the provisioner's own steps on
        // an image run beside it (under bubblewrap, on the host's /usr).
        if record.isolation == Kind::Gvisor {
            return self.isolation.forwarder.is_some()
                && (tools == prepare::Tools::Sandbox || record.image.is_none());
        }
        self.config.sandbox_init
            && self.isolation.forwarder.is_some()
            && (tools == prepare::Tools::Sandbox || record.image.is_none())
    }

    /// A gVisor sandbox's container is started as soon as the sandbox is made, in the
    /// background: runsc's start (about 150 ms here, `docs/performance.md`) then runs
    /// while its caller does what comes before the first command (a fork's health check,
    /// its agent activity's dispatch to a runner) instead of in front of that command.
    /// Bubblewrap's init starts in a few ms: left to the first command. A start that
    /// fails is only logged: the first command starts the init again and says why.
    pub(crate) fn boot_in_background(self: &Arc<Self>, id: &str) {
        let Ok(entry) = self.entry(id) else { return };
        let record = entry.record();
        if record.isolation != Kind::Gvisor
            || !self.runs_under_init(&record, prepare::Tools::Sandbox)
        {
            return;
        }
        let core = self.clone();
        tokio::task::spawn_blocking(move || {
            // Its cgroups first, as before any command (`ensure_cgroups`).
            let started = core
                .ensure_cgroups(&entry)
                .and_then(|()| core.init_of(&entry, &record));
            if let Err(e) = started {
                tracing::debug!(sandbox_id = %record.id, error = %e, "sandbox init not started at create");
            }
        });
    }

    /// The sandbox's running init, started now when it has none.
    pub(crate) fn init_of(&self, entry: &Arc<Entry>, record: &Record) -> Result<Arc<Init>> {
        let mut session = entry.init.lock().expect("init lock");
        // Checked under the lock stop and destroy take to end the init: an init is never
        // started for a sandbox being stopped or destroyed.
        if entry.execs.borrow().destroying || entry.record().stopped {
            return Err(ProvisionerError::FailedPrecondition(format!(
                "sandbox {} is stopped or being destroyed",
                record.id
            )));
        }
        if let Some(s) = session.as_ref()
            && !s.init.is_gone()
        {
            return Ok(s.init.clone());
        }
        // The old session's relay removes its socket as it goes: before the new one binds.
        if let Some(old) = session.take() {
            old.init.shutdown();
        }
        let Some(forwarder) = self.isolation.forwarder.as_ref() else {
            return Err(ProvisionerError::internal(
                "start the sandbox's init",
                "no forwarder",
            ));
        };
        let id = record.id.as_str();
        let llm_socket = self.storage.store.dir(id).join("llm.sock");
        let relay = self.shared_llm_relay(entry, record, &llm_socket)?;
        let init = self
            .start_init(record, forwarder, &llm_socket)
            .map(Arc::new)?;
        tracing::debug!(sandbox_id = %id, "sandbox init started");
        *session = Some(InitSession::new(init.clone(), relay));
        Ok(init)
    }

    /// The sandbox's one long-lived bubblewrap, with the init in it, its relays bound
    /// (the LLM relay's at `llm_socket`).
    fn start_init(
        &self,
        record: &Record,
        forwarder: &ForwarderKit,
        llm_socket: &Path,
    ) -> Result<Init> {
        let id = record.id.as_str();
        let workspace = self.storage.store.mountpoint(id);
        let overlay = self.storage.store.overlays().mount_of(id);
        let egress = self.storage.store.egress_socket(id);
        let procs = self.cgroup_joins(id);
        let argv = forwarder.argv();
        let inv = Invocation {
            relays: Some(Relays {
                forwarder,
                egress: (!record.egress_allow.is_empty()).then_some(egress.as_path()),
                llm: Some(llm_socket),
            }),
            cgroup_joins: &procs,
            image: record.image.as_ref().map(|i| ImageRoot {
                rootfs: &i.rootfs,
                env: &i.env,
            }),
            init: true,
            ..self.invocation(record, &workspace, overlay.as_deref(), &argv, &[])
        };
        let started = match record.isolation {
            Kind::Bubblewrap => Init::start(&inv, id),
            Kind::Gvisor => {
                let runsc = self
                    .isolation
                    .gvisor
                    .runsc()
                    .map_err(ProvisionerError::FailedPrecondition)?;
                let layout = Layout::of_sandbox(&self.storage.store.dir(id));
                // A container id of its own each start: runsc keeps an ended one's state.
                let cid = format!("{id}-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
                Init::start_with(id, false, |stdin, stderr| {
                    runsc.spawn(&inv, (&layout, &cid, record.limits.pids), stdin, stderr)
                })
            }
        };
        started.map_err(|e| ProvisionerError::internal("start the sandbox's init", e))
    }

    /// The sandbox's one LLM relay at `socket`: it relays to the gateway of whichever of
    /// the sandbox's LLM commands runs (`entry.llm`), and dies with the sandbox.
    fn shared_llm_relay(&self, entry: &Entry, record: &Record, socket: &Path) -> Result<Relay> {
        let slot = entry.llm.clone();
        llm_relay::spawn(
            socket,
            Arc::new(move || slot.current()),
            &record.id,
            self.config.llm_relay,
            entry.cancel.child_token(),
        )
        .and_then(|relay| {
            self.give_to_sandbox(record, socket)?;
            Ok(relay)
        })
        .map_err(|e| ProvisionerError::internal("start the llm relay", e))
    }
}
