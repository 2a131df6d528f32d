//! Running commands in a sandbox: the unary exec, and the shared preparation (admission,
//! cgroups, egress, environment) every kind of exec goes through.

use crate::local::{init::wire::Spec, launch::Launch};
use crate::{
    error::{ProvisionerError, Result},
    limits::OUTPUT_CAP,
    local::{
        bwrap::{ImageRoot, Invocation, Relays},
        entry::{Entry, ExecGuard},
        process::{self, Caps, Finished, Outcome},
        provisioner::Provisioner,
        store,
    },
    validate,
};
use forkyard_proto::sandbox::v1::{ExecRequest, ExecResponse};
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
    Relay(#[allow(dead_code)] crate::local::llm_relay::Relay),
    Lease(#[allow(dead_code)] crate::local::llm_relay::LlmLease),
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

/// Whether a command is stopped once the workspace grows past its disk limit.
#[derive(Debug, Clone, Copy)]
enum WatchDisk {
    Yes,
    No,
}

/// What a command may take: time, captured output, the workspace's disk limit.
#[derive(Debug, Clone, Copy)]
struct Bounds {
    timeout: Duration,
    caps: Caps,
    watch: WatchDisk,
    tools: Tools,
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
    /// Validated argv + env, and the timeout the request asks for.
    pub(crate) fn exec_params(
        &self,
        argv: &[String],
        env: &std::collections::HashMap<String, String>,
        timeout_secs: u32,
    ) -> Result<(Vec<(String, String)>, Duration)> {
        validate::argv(argv)?;
        validate::env_total(env)?;
        let mut out = Vec::with_capacity(env.len());
        for (k, v) in env {
            validate::env(k, v)?;
            out.push((k.clone(), v.clone()));
        }
        out.sort();
        let timeout = match timeout_secs {
            0 => self.config.exec_timeout,
            s => Duration::from_secs(s.into()),
        };
        Ok((out, timeout))
    }

    pub async fn exec(&self, req: ExecRequest) -> Result<ExecResponse> {
        let (env, timeout) = self.exec_params(&req.argv, &req.env, req.timeout_secs)?;
        let caps = match req.output_tail_bytes {
            0 => Caps {
                stdout: OUTPUT_CAP,
                stderr: OUTPUT_CAP,
                tail: false,
            },
            n => {
                let n = usize::try_from(n).unwrap_or(OUTPUT_CAP).min(OUTPUT_CAP);
                Caps {
                    stdout: n,
                    stderr: n,
                    tail: true,
                }
            }
        };
        let (f, after) = self
            .run_checked(
                &req.sandbox_id,
                &req.argv,
                &env,
                &req.llm_gateway,
                Bounds {
                    timeout,
                    caps,
                    watch: WatchDisk::Yes,
                    tools: Tools::Sandbox,
                },
            )
            .await?;
        let timed_out = matches!(f.outcome, Outcome::TimedOut);
        let exit_code = match f.outcome {
            Outcome::Exited { code } => code,
            _ => -1,
        };
        Ok(ExecResponse {
            exit_code,
            output_truncated: f.stdout.truncated() || f.stderr.truncated(),
            stdout: f.stdout.lossy(),
            stderr: f.stderr.lossy(),
            timed_out,
            duration_ms: u64::try_from(f.duration.as_millis()).unwrap_or(u64::MAX),
            oom_killed: after.oom_killed,
            workspace_over_limit: after.workspace_over_limit,
        })
    }

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
            url => Some(crate::local::llm_relay::authority(url)?),
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
        if llm_gateway.is_some() && self.forwarder.is_none() {
            return Err(ProvisionerError::FailedPrecondition(
                "this provisioner has no sandbox-egress-forwarder (FORKYARD_EGRESS_FORWARDER): it cannot offer an LLM endpoint".into(),
            ));
        }
        let workspace = self.store.workspace(id);
        let socket = self.store.egress_socket(id);
        let egress = !record.egress_allow.is_empty();
        let image = match tools {
            Tools::Sandbox => record.image.as_ref().map(|i| ImageRoot {
                rootfs: &i.rootfs,
                env: &i.env,
            }),
            Tools::Provisioner => None,
        };
        let oom_before = self.cgroups.as_ref().map_or(0, |cg| cg.oom_kills(id));
        let (launch, llm) = if self.runs_under_init(&record, tools) {
            // The sandbox's init runs the command: only its environment is made here.
            let lease = llm_gateway.map(|g| entry.llm.lease(g, id)).transpose()?;
            let llm_socket = self.store.dir(id).join("llm.sock");
            let inv = Invocation {
                bwrap: &self.bwrap,
                features: self.features,
                workspace: &workspace,
                sandbox_id: id,
                relays: self.forwarder.as_ref().map(|forwarder| Relays {
                    forwarder,
                    egress: egress.then_some(socket.as_path()),
                    llm: lease.is_some().then_some(llm_socket.as_path()),
                }),
                cgroup_procs: &[],
                argv,
                env,
                seccomp: &self.seccomp,
                uid: self.uid_of(&record),
                image,
                init: false,
            };
            let mut env = inv.env();
            // What bubblewrap's `--chdir` sets (over a caller's) for a command it starts.
            env.retain(|(k, _)| k != "PWD");
            env.push(("PWD".into(), crate::local::bwrap::WORKSPACE.into()));
            let spec = Spec {
                argv: argv.to_vec(),
                env,
            };
            let init = self.init_of(&entry, &record)?;
            (Launch::Init { init, spec }, lease.map(LlmHold::Lease))
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

    /// A bubblewrap of the command's own (no init, or the provisioner's own step on an
    /// image); with `llm_gateway`, a relay of its own.
    #[allow(clippy::too_many_arguments)]
    fn bwrap_per_command(
        &self,
        entry: &Arc<Entry>,
        record: &crate::local::store::Record,
        argv: &[String],
        env: &[(String, String)],
        llm_gateway: Option<String>,
        image: Option<ImageRoot<'_>>,
        pty: bool,
    ) -> Result<(Launch, Option<LlmHold>)> {
        let id = record.id.as_str();
        let workspace = self.store.workspace(id);
        let socket = self.store.egress_socket(id);
        let egress = !record.egress_allow.is_empty();
        let llm_socket = llm_gateway.is_some().then(|| {
            self.store.dir(id).join(format!(
                "llm-{}.sock",
                &uuid::Uuid::new_v4().simple().to_string()[..8]
            ))
        });
        let relays = match (&self.forwarder, egress || llm_socket.is_some()) {
            (Some(fwd), true) => Some(Relays {
                forwarder: fwd,
                egress: egress.then_some(socket.as_path()),
                llm: llm_socket.as_deref(),
            }),
            _ => None,
        };
        let llm_relay = match (&llm_socket, llm_gateway) {
            (Some(path), Some(gateway)) => {
                let stop = entry.cancel.child_token();
                Some(
                    crate::local::llm_relay::spawn(
                        path,
                        Arc::new(move || Some(gateway.clone())),
                        id,
                        stop,
                    )
                    .and_then(|relay| {
                        self.give_to_sandbox(record, path)?;
                        Ok(relay)
                    })
                    .map_err(|e| ProvisionerError::internal("start the llm relay", e))?,
                )
            }
            _ => None,
        };
        let procs = self
            .cgroups
            .as_ref()
            .map(|cg| cg.procs_files(id))
            .unwrap_or_default();
        let argv = if pty {
            crate::local::terminal::with_ctty(argv)
        } else {
            argv.to_vec()
        };
        let inv = Invocation {
            bwrap: &self.bwrap,
            features: self.features,
            workspace: &workspace,
            sandbox_id: id,
            relays,
            cgroup_procs: &procs,
            argv: &argv,
            env,
            seccomp: &self.seccomp,
            uid: self.uid_of(record),
            image,
            init: false,
        };
        let command = inv
            .command()
            .map_err(|e| ProvisionerError::internal("prepare the command's environment", e))?;
        Ok((Launch::Process(command), llm_relay.map(LlmHold::Relay)))
    }

    /// After a command: did the kernel OOM-kill something, is the workspace too big.
    pub(crate) async fn aftermath(&self, p: &Prepared) -> Aftermath {
        let id = p.entry.record().id;
        let oom_killed = self
            .cgroups
            .as_ref()
            .is_some_and(|cg| cg.oom_kills(&id) > p.oom_before);
        let ws = self.store.workspace(&id);
        let bytes = tokio::task::spawn_blocking(move || store::disk_usage(&ws))
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

    /// Run one command to completion in a fresh bubblewrap over the sandbox's workspace.
    pub(crate) async fn run_in(
        &self,
        id: &str,
        argv: &[String],
        env: &[(String, String)],
        timeout: Duration,
        caps: Caps,
    ) -> Result<Finished> {
        // The provisioner's own commands (patch collection) run on a workspace that
        // may be over its limit already: that is what they are there to deal with.
        Ok(self
            .run_checked(
                id,
                argv,
                env,
                "",
                Bounds {
                    timeout,
                    caps,
                    watch: WatchDisk::No,
                    tools: Tools::Provisioner,
                },
            )
            .await?
            .0)
    }

    /// Traced as a `sandbox.exec` span: the sandbox, the program (never its arguments:
    /// they may hold a prompt or a secret) and how it ended.
    #[tracing::instrument(
        name = "sandbox.exec",
        skip_all,
        fields(sandbox_id = %id, program = argv.first().map_or("", String::as_str), exit_code = tracing::field::Empty)
    )]
    async fn run_checked(
        &self,
        id: &str,
        argv: &[String],
        env: &[(String, String)],
        llm_gateway: &str,
        bounds: Bounds,
    ) -> Result<(Finished, Aftermath)> {
        let Bounds {
            timeout,
            caps,
            watch,
            tools,
        } = bounds;
        let mut p = self.prepare(id, argv, env, llm_gateway, tools, false)?;
        let launch = p.launch.take().expect("prepared once");
        let disk_bytes = match watch {
            WatchDisk::Yes => p.entry.record().disk_bytes,
            WatchDisk::No => 0,
        };
        let started = std::time::Instant::now();
        let f = tokio::select! {
            f = process::run(launch, timeout, caps, &p.cancel) => {
                f.map_err(|e| ProvisionerError::internal("cannot start bwrap", e))?
            }
            // Dropping the run kills the command's process tree.
            bytes = crate::local::disk_watch::over_limit(self.store.workspace(id), disk_bytes) => {
                tracing::warn!(sandbox_id = %id, bytes, "command stopped: workspace over its disk limit");
                Finished {
                    outcome: Outcome::Exited { code: -1 },
                    stdout: Default::default(),
                    stderr: Default::default(),
                    duration: started.elapsed(),
                }
            }
        };
        if matches!(f.outcome, Outcome::Cancelled) {
            return Err(ProvisionerError::FailedPrecondition(format!(
                "sandbox {id} was stopped or destroyed while the command ran"
            )));
        }
        if let Outcome::Exited { code } = f.outcome {
            tracing::Span::current().record("exit_code", code);
        }
        let after = self.aftermath(&p).await;
        Ok((f, after))
    }
}
