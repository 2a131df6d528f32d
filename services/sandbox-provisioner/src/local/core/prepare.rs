//! What every kind of exec goes through before its command starts: admission (the
//! sandbox live, not stopped), its cgroups, its LLM relay, and its command line (for the
//! sandbox's init, or a bubblewrap of its own); and after it, what the limits did.

use crate::{
    error::{ProvisionerError, Result},
    local::{
        core::{
            entry::{Entry, ExecGuard},
            provisioner::Provisioner,
        },
        isolation::{
            Kind,
            bubblewrap::{
                bwrap,
                bwrap::{ImageRoot, Invocation, Relays},
            },
            command::{launch::Launch, plain_command, terminal},
            init::wire::Spec,
            network::llm_relay,
        },
        storage::{
            disk_quota,
            store::{self, Record},
        },
    },
};
use forkyard_proto::sandbox::v1::ExecResponse;
use std::{sync::Arc, time::Duration};
use tokio_util::sync::CancellationToken;

/// A command ready to spawn in a sandbox, holding its place in the sandbox's exec count.
pub(crate) struct Prepared {
    pub(crate) entry: Arc<Entry>,
    /// Taken when it is spawned.
    pub(crate) launch: Option<Launch>,
    /// Fires when the sandbox is stopped or destroyed: the command must die.
    pub(crate) cancel: CancellationToken,
    oom_before: u64,
    _guard: ExecGuard,
    /// The command's way to its LLM gateway, closed when the command is done with.
    _llm: Option<LlmHold>,
}

/// A command's hold on an LLM gateway: a relay of its own (a bubblewrap per command) or
/// its place in the sandbox's shared one (under the sandbox's init).
enum LlmHold {
    Relay(#[allow(dead_code)] llm_relay::Relay),
    Lease(#[allow(dead_code)] llm_relay::LlmLease),
}

/// What the sandbox's limits did to one command.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Aftermath {
    pub(crate) oom_killed: bool,
    pub(crate) workspace_over_limit: bool,
}

impl Aftermath {
    /// The final result of a streamed or PTY command (its output went out as it came).
    pub(crate) fn exit(self, exit_code: i32, timed_out: bool, took: Duration) -> ExecResponse {
        ExecResponse {
            exit_code,
            timed_out,
            duration_ms: u64::try_from(took.as_millis()).unwrap_or(u64::MAX),
            oom_killed: self.oom_killed,
            workspace_over_limit: self.workspace_over_limit,
            ..Default::default()
        }
    }
}

/// Whose tools a command runs with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Tools {
    /// The sandbox's: its image's root filesystem, or the host's /usr without one. What
    /// callers and agents run.
    Sandbox,
    /// The provisioner's: the host's /usr, for its own steps (health probe, the git steps
    /// of patch collection), which an image need not carry. Same isolation either way.
    Provisioner,
}

impl Provisioner {
    /// Admit a command into the sandbox and build its bubblewrap command line; with
    /// `llm_gateway`, start the relay that is the command's way to it.
    pub(crate) fn prepare(
        &self,
        id: &str,
        argv: &[String],
        env: &[(String, String)],
        llm_gateway: &str,
        tools: Tools,
        pty: bool,
    ) -> Result<Prepared> {
        let llm_gateway = match llm_gateway {
            "" => None,
            url => Some(llm_relay::authority(url)?),
        };
        let entry = self.entry(id)?;
        // Taken before the stopped check: a stop after it fires this very token.
        let cancel = entry.exec_cancel();
        let Some(guard) = entry.begin_exec() else {
            return Err(ProvisionerError::FailedPrecondition(format!(
                "sandbox {id} is being destroyed"
            )));
        };
        let record = entry.record();
        if record.stopped {
            return Err(ProvisionerError::FailedPrecondition(format!(
                "sandbox {id} is stopped; start it first"
            )));
        }
        self.ensure_cgroups(&entry)?;
        if llm_gateway.is_some() && self.isolation.forwarder.is_none() {
            return Err(ProvisionerError::FailedPrecondition(
                "this provisioner has no sandbox-egress-forwarder (FORKYARD_EGRESS_FORWARDER): it cannot offer an LLM endpoint".into(),
            ));
        }
        let image = match tools {
            Tools::Sandbox => record.image.as_ref().map(|i| ImageRoot {
                rootfs: &i.rootfs,
                env: &i.env,
            }),
            Tools::Provisioner => None,
        };
        let oom_before = self
            .isolation
            .cgroups
            .as_ref()
            .map_or(0, |cg| cg.oom_kills(id));
        let under_init = self.runs_under_init(&record, tools);
        if !under_init && record.isolation == Kind::Gvisor && tools == Tools::Sandbox {
            // Never a bubblewrap for a command of a sandbox that asked for gVisor.
            return Err(ProvisionerError::FailedPrecondition(format!(
                "sandbox {id} runs under gVisor, which needs the egress forwarder (FORKYARD_EGRESS_FORWARDER) this provisioner no longer has"
            )));
        }
        let (launch, llm) = if under_init {
            self.under_init(&entry, &record, argv, env, llm_gateway, image)?
        } else {
            self.bwrap_per_command(&entry, &record, argv, env, llm_gateway, image, pty)?
        };
        Ok(Prepared {
            launch: Some(launch),
            cancel,
            entry,
            oom_before,
            _guard: guard,
            _llm: llm,
        })
    }

    /// A command in `record`'s sandbox with what every command there gets: its workspace
    /// (and overlay), the runtime and its features, seccomp, the agent tools, the
    /// sandbox's uid and file-size bound; no relays, cgroups or image (callers add theirs).
    pub(crate) fn invocation<'a>(
        &'a self,
        record: &'a Record,
        workspace: &'a std::path::Path,
        overlay: Option<&'a std::os::fd::OwnedFd>,
        argv: &'a [String],
        env: &'a [(String, String)],
    ) -> Invocation<'a> {
        Invocation {
            bwrap: &self.isolation.bwrap,
            features: self.isolation.features,
            workspace,
            overlay: overlay.map(std::os::fd::AsFd::as_fd),
            sandbox_id: &record.id,
            relays: None,
            cgroup_joins: &[],
            argv,
            env,
            seccomp: &self.isolation.seccomp,
            tools: self.isolation.agent_tools.as_deref(),
            toolchains: &self.isolation.toolchains,
            uid: self.uid_of(record),
            image: None,
            init: false,
            file_size: disk_quota::file_size_limit(record.disk_bytes),
        }
    }

    /// The command for the sandbox's init, which runs it: only its environment is made
    /// here; with `llm_gateway`, its place in the sandbox's one LLM relay.
    fn under_init(
        &self,
        entry: &Arc<Entry>,
        record: &Record,
        argv: &[String],
        env: &[(String, String)],
        llm_gateway: Option<String>,
        image: Option<ImageRoot<'_>>,
    ) -> Result<(Launch, Option<LlmHold>)> {
        let id = record.id.as_str();
        let workspace = self.storage.store.mountpoint(id);
        let overlay = self.storage.store.overlays().mount_of(id);
        let socket = self.storage.store.egress_socket(id);
        let egress = !record.egress_allow.is_empty();
        let lease = llm_gateway.map(|g| entry.llm.lease(g, id)).transpose()?;
        let llm_socket = self.storage.store.dir(id).join("llm.sock");
        let inv = Invocation {
            relays: self.isolation.forwarder.as_ref().map(|forwarder| Relays {
                forwarder,
                egress: egress.then_some(socket.as_path()),
                llm: lease.is_some().then_some(llm_socket.as_path()),
            }),
            image,
            ..self.invocation(record, &workspace, overlay.as_deref(), argv, env)
        };
        let mut env = inv.env();
        // What bubblewrap's `--chdir` sets (over a caller's) for a command it starts.
        env.retain(|(k, _)| k != "PWD");
        env.push(("PWD".into(), bwrap::WORKSPACE.into()));
        let spec = Spec {
            argv: plain_command::unwrapped(argv).unwrap_or_else(|| argv.to_vec()),
            env,
        };
        let init = self.init_of(entry, record)?;
        Ok((Launch::Init { init, spec }, lease.map(LlmHold::Lease)))
    }

    /// A bubblewrap of the command's own (no init, or the provisioner's own step on an
    /// image); with `llm_gateway`, a relay of its own.
    #[allow(clippy::too_many_arguments)]
    fn bwrap_per_command(
        &self,
        entry: &Arc<Entry>,
        record: &Record,
        argv: &[String],
        env: &[(String, String)],
        llm_gateway: Option<String>,
        image: Option<ImageRoot<'_>>,
        pty: bool,
    ) -> Result<(Launch, Option<LlmHold>)> {
        let id = record.id.as_str();
        let workspace = self.storage.store.mountpoint(id);
        let overlay = self.storage.store.overlays().mount_of(id);
        let socket = self.storage.store.egress_socket(id);
        let egress = !record.egress_allow.is_empty();
        let llm_socket = llm_gateway.is_some().then(|| self.own_llm_socket(id));
        let relays = match (&self.isolation.forwarder, egress || llm_socket.is_some()) {
            (Some(fwd), true) => Some(Relays {
                forwarder: fwd,
                egress: egress.then_some(socket.as_path()),
                llm: llm_socket.as_deref(),
            }),
            _ => None,
        };
        let llm_relay = match (&llm_socket, llm_gateway) {
            (Some(path), Some(gateway)) => Some(self.llm_relay(entry, record, path, gateway)?),
            _ => None,
        };
        let procs = self.cgroup_joins(id);
        let argv = if pty {
            terminal::with_ctty(argv)
        } else {
            argv.to_vec()
        };
        let inv = Invocation {
            relays,
            cgroup_joins: &procs,
            image,
            ..self.invocation(record, &workspace, overlay.as_deref(), &argv, env)
        };
        let command = inv
            .command()
            .map_err(|e| ProvisionerError::internal("prepare the command's environment", e))?;
        Ok((Launch::Process(command), llm_relay.map(LlmHold::Relay)))
    }

    /// Where a command's own LLM relay listens: a socket of its own in the sandbox's
    /// directory, named afresh.
    fn own_llm_socket(&self, id: &str) -> std::path::PathBuf {
        self.storage.store.dir(id).join(format!(
            "llm-{}.sock",
            &uuid::Uuid::new_v4().simple().to_string()[..8]
        ))
    }

    /// A relay of the command's own to `gateway`, its socket at `path` owned by the
    /// sandbox's uid; it stops with the sandbox.
    fn llm_relay(
        &self,
        entry: &Arc<Entry>,
        record: &Record,
        path: &std::path::Path,
        gateway: String,
    ) -> Result<llm_relay::Relay> {
        let stop = entry.cancel.child_token();
        llm_relay::spawn(
            path,
            Arc::new(move || Some(gateway.clone())),
            &record.id,
            self.config.llm_relay,
            stop,
        )
        .and_then(|relay| {
            self.give_to_sandbox(record, path)?;
            Ok(relay)
        })
        .map_err(|e| ProvisionerError::internal("start the llm relay", e))
    }

    /// After a command: did the kernel OOM-kill something, is the workspace too big.
    pub(crate) async fn aftermath(&self, p: &Prepared) -> Aftermath {
        let id = p.entry.record().id;
        let oom_killed = self
            .isolation
            .cgroups
            .as_ref()
            .is_some_and(|cg| cg.oom_kills(&id) > p.oom_before);
        let ws = self.storage.store.own_files(&p.entry.record());
        let bytes = tokio::task::spawn_blocking(move || store::workspace_usage(&ws))
            .await
            .unwrap_or(0);
        let over = {
            let mut r = p.entry.record.lock().expect("record lock");
            r.workspace_bytes = bytes;
            r.over_limit()
        };
        if over {
            tracing::warn!(sandbox_id = %id, bytes, "workspace over its disk limit");
        }
        Aftermath {
            oom_killed,
            workspace_over_limit: over,
        }
    }
}
