//! Running commands in a sandbox to their end: the unary exec, and the provisioner's
//! own commands (`run_in`). What every kind of exec goes through first is `prepare`.

use crate::{
    error::{ProvisionerError, Result},
    limits::OUTPUT_CAP,
    local::{
        core::{
            prepare::{Aftermath, Tools},
            provisioner::Provisioner,
        },
        isolation::command::process::{self, Caps, Finished, Outcome},
        storage::disk_watch,
    },
    validate,
};
use forkyard_proto::sandbox::v1::{ExecRequest, ExecResponse};
use std::{os::fd::OwnedFd, time::Duration};

/// Whether a command is stopped once the workspace grows past its disk limit.
#[derive(Debug, Clone, Copy)]
enum WatchDisk {
    Yes,
    No,
}

/// What a command may take (time, captured output, the workspace's disk limit), and
/// what it is given.
#[derive(Debug)]
struct Bounds {
    timeout: Duration,
    caps: Caps,
    watch: WatchDisk,
    tools: Tools,
    /// Its stdin (else /dev/null).
    input: Option<OwnedFd>,
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
                    input: None,
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

    /// Run one of the provisioner's own commands to completion in the sandbox, with the
    /// host's tools, its stdin from `input`.
    pub(crate) async fn run_in(
        &self,
        id: &str,
        argv: &[String],
        env: &[(String, String)],
        input: Option<OwnedFd>,
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
                    input,
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
            input,
        } = bounds;
        let mut p = self.prepare(id, argv, env, llm_gateway, tools, false)?;
        let launch = p.launch.take().expect("prepared once");
        let disk_bytes = match watch {
            WatchDisk::Yes => p.entry.record().disk_bytes,
            WatchDisk::No => 0,
        };
        let started = std::time::Instant::now();
        let f = tokio::select! {
            f = process::run(launch, input, timeout, caps, &p.cancel) => {
                f.map_err(|e| ProvisionerError::internal("cannot start bwrap", e))?
            }
            // Dropping the run kills the command's process tree.
            bytes = disk_watch::over_limit(self.storage.store.own_files(&p.entry.record()), disk_bytes) => {
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
        // The provisioner's own steps (the patch, the health probe) need not know what the
        // limits did: the walk of the workspace is left to the caller's next command.
        let after = match tools {
            Tools::Sandbox => self.aftermath(&p).await,
            Tools::Provisioner => Aftermath::default(),
        };
        Ok((f, after))
    }
}
