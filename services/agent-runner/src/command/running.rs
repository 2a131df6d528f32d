//! The command on its way: started through the provisioner's `ExecStream`, its events
//! followed (stdout metered, stderr kept, heartbeats with the sandbox's cost) until it
//! exits, then its usage settled and the response made.

use super::{
    output::{Stderr, output_tail},
    stop::{SETTLE, ledger_away, spent},
};
use crate::{
    command_meter::{Lines, Meter, add_totals},
    error::AgentError,
    llm_gateway::grants::{GrantHandle, Stop},
    progress::{ProgressSink, first_beat_after},
    sandbox_cost::SandboxCost,
    usage_stream::{Reading, UsageStream},
};
use forkyard_common::grpc_telemetry::TracedChannel as Channel;
use forkyard_proto::{
    agent::v1::{RunAgentRequest, RunAgentResponse},
    sandbox::v1::{
        ExecEvent, ExecRequest, ExecResponse, exec_event::Event,
        sandbox_provisioner_client::SandboxProvisionerClient,
    },
};
use serde_json::json;
use std::{future::Future, pin::Pin, time::Duration};
use tonic::Streaming;

/// What stops the command from the caller's side.
type Cancelled<'a> = Pin<Box<dyn Future<Output = ()> + Send + 'a>>;

/// One run of the command: its meter, the fork's gateway grant, the sandbox it runs in
/// and what it has printed so far.
pub(super) struct Running<'a, 'g, S: ProgressSink> {
    pub(super) meter: Meter<'a, S>,
    pub(super) grant: Option<&'g GrantHandle>,
    pub(super) client: SandboxProvisionerClient<Channel>,
    pub(super) endpoint: String,
    pub(super) sandbox_cost: SandboxCost,
    pub(super) stdout: Lines,
    pub(super) stderr: Stderr,
    pub(super) readings: UsageStream,
    /// The CLI's session id, once it printed one (a branch of this fork resumes it).
    pub(super) session_id: String,
}

fn sandbox_error(req: &RunAgentRequest, endpoint: &str, s: &tonic::Status) -> AgentError {
    match s.code() {
        tonic::Code::Unavailable
        | tonic::Code::Unknown
        | tonic::Code::Internal
        | tonic::Code::DeadlineExceeded
        | tonic::Code::Cancelled => AgentError::Unavailable {
            endpoint: endpoint.to_owned(),
            message: s.message().to_owned(),
        },
        _ => AgentError::Sandbox {
            sandbox_id: req.sandbox_id.clone(),
            message: s.message().to_owned(),
        },
    }
}

impl<S: ProgressSink> Running<'_, '_, S> {
    /// Start the command; CANCELLED if `cancelled` resolves first.
    pub(super) async fn start(
        &mut self,
        exec: ExecRequest,
        cancelled: &mut Cancelled<'_>,
    ) -> Result<Streaming<ExecEvent>, AgentError> {
        let req = self.meter.req;
        Ok(tokio::select! {
            res = self.client.exec_stream(exec) => res.map_err(|s| sandbox_error(req, &self.endpoint, &s))?.into_inner(),
            () = &mut *cancelled => return Err(self.cancel()),
        })
    }

    /// Follow the command's events, heartbeating every `heartbeat`, until it exits: its
    /// exit status. An error ends the command (the caller drops `stream`).
    pub(super) async fn follow(
        &mut self,
        stream: &mut Streaming<ExecEvent>,
        heartbeat: Duration,
        cancelled: &mut Cancelled<'_>,
    ) -> Result<ExecResponse, AgentError> {
        let grant = self.grant;
        let stopped = async {
            match grant {
                Some(g) => g.stopped().await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(stopped);
        let mut ticker = first_beat_after(heartbeat);
        loop {
            let event = tokio::select! {
                ev = stream.message() => ev.map_err(|s| sandbox_error(self.meter.req, &self.endpoint, &s))?,
                _ = ticker.tick() => {
                    self.tick().await?;
                    continue;
                }
                () = &mut *cancelled => return Err(self.cancel()),
                why = &mut stopped => return Err(match why {
                    Stop::Spent(why) => spent(&mut self.meter, grant, why).await,
                    Stop::LedgerAway(why) => ledger_away(&mut self.meter, grant, why).await,
                }),
            };
            match event.and_then(|e| e.event) {
                Some(Event::Stdout(chunk)) => {
                    for line in self.stdout.push(&chunk) {
                        self.stdout_line(&line).await?;
                    }
                }
                Some(Event::Stderr(chunk)) => self.stderr.push(&chunk),
                Some(Event::Exit(exit)) => return Ok(exit),
                None => {
                    return Err(AgentError::Unavailable {
                        endpoint: self.endpoint.clone(),
                        message: "exec stream ended without the command's exit status".into(),
                    });
                }
            }
        }
    }

    /// A heartbeat: the sandbox's cost so far charged, then the progress reported (with
    /// the gateway's requests once the agent uses it).
    async fn tick(&mut self) -> Result<(), AgentError> {
        if let Err(e) = self
            .sandbox_cost
            .tick(&mut self.client, &mut self.meter.progress)
            .await
        {
            let why = e.to_string();
            return Err(spent(&mut self.meter, self.grant, format!("sandbox time: {why}")).await);
        }
        let totals = self.grant.filter(|g| g.used()).map(GrantHandle::totals);
        self.meter
            .beat_with("command running", totals.as_ref())
            .await;
        Ok(())
    }

    /// A line of stdout: into the transcript, and, unless the agent's model traffic goes
    /// through the gateway, read for usage.
    async fn stdout_line(&mut self, line: &str) -> Result<(), AgentError> {
        self.meter.record_output(line);
        if self.session_id.is_empty()
            && let Some(id) = crate::branch::session_in(line)
        {
            if let Some(g) = self.grant {
                g.set_session(&id);
            }
            self.session_id = id;
        }
        if self.grant.is_some_and(GrantHandle::used) {
            return Ok(());
        }
        match self.readings.line(line) {
            // Dropping `stream` on a refusal kills the command.
            Some(Reading::Turn { usage, model }) => self.meter.turn(usage, model).await?,
            Some(Reading::Total(t)) => self.meter.total = Some(t),
            None => {}
        }
        Ok(())
    }

    fn cancel(&mut self) -> AgentError {
        let (req, meter) = (self.meter.req, &mut self.meter);
        meter
            .transcript
            .write(&json!({"type": "end", "reason": "cancelled", "turns": meter.progress.turns}));
        tracing::info!(run_id = %req.run_id, fork = req.fork, sandbox_id = %req.sandbox_id, "agent cancelled, killing its command");
        AgentError::Cancelled
    }

    /// After the exit: the stream read to its end, then stdout's last, unfinished line.
    pub(super) async fn drain(
        &mut self,
        mut stream: Streaming<ExecEvent>,
    ) -> Result<(), AgentError> {
        // Read on to the trailers: a call dropped before them ends as CANCELLED (its spans
        // marked failed) though the command exited normally.
        let _ = tokio::time::timeout(Duration::from_secs(5), async {
            while let Ok(Some(_)) = stream.message().await {}
        })
        .await;
        drop(stream);
        if let Some(line) = self.stdout.finish() {
            self.stdout_line(&line).await?;
        }
        Ok(())
    }

    /// The exited command's response, its usage settled.
    pub(super) async fn finish(
        mut self,
        exit: ExecResponse,
    ) -> Result<RunAgentResponse, AgentError> {
        let kept = self.stdout.kept();
        self.settle(&exit, &kept).await?;
        let p = &self.meter.progress;
        // What the ledger holds is at least what was charged; never report less.
        let cost_micros = p.cost_micros.max(p.charged_micros);
        self.meter.transcript.write(&json!({
            "type": "end", "reason": if exit.timed_out { "timeout" } else { "exit" },
            "exit_code": exit.exit_code, "turns": p.turns, "cost_micros": cost_micros, "usage": p.usage,
        }));
        let out = RunAgentResponse {
            exit_code: exit.exit_code,
            timed_out: exit.timed_out,
            output_tail: output_tail(self.meter.req, &kept, &self.stderr),
            usage: Some(p.usage.unwrap_or_default()),
            cost_micros,
            duration_ms: self.meter.started.elapsed().as_millis() as u64,
            turns: p.turns,
            transcript_key: self.meter.transcript.key.clone(),
            sandbox_charged_micros: p.sandbox_charged_micros,
            workspace_over_limit: exit.workspace_over_limit,
            session_id: self.session_id.clone(),
            ..Default::default()
        };
        // What a retry would resume from, should this completion be lost; a command that
        // reported no usage leaves nothing to resume (and spares Temporal a write per fork).
        if p.turns > 0 || p.charged_micros > 0 || p.cost_micros > 0 {
            self.meter.beat("command exited").await;
        }
        Ok(out)
    }

    /// What the command used, final: the gateway's totals once every charge settled, or
    /// (without the gateway) stdout's reports reconciled with the CLI's own total (`kept`
    /// is the end of stdout).
    async fn settle(&mut self, exit: &ExecResponse, kept: &str) -> Result<(), AgentError> {
        let Some(g) = self.grant.filter(|g| g.used()) else {
            self.meter.reconcile(kept);
            return Ok(());
        };
        let totals = g.settle(SETTLE).await;
        if let Some(why) = totals.exhausted {
            return Err(spent(&mut self.meter, self.grant, why).await);
        }
        add_totals(&mut self.meter.progress, &totals);
        self.meter.write_gateway_totals(&totals);
        // The agent gave up because the model API failed it: worth another attempt
        // (the agent retry table), which resumes from this beat's charges.
        if exit.exit_code != 0 && !exit.timed_out && totals.upstream_failures > 0 {
            self.meter.beat("model api unavailable").await;
            return Err(AgentError::Model(crate::llm::LlmError::Unavailable {
                status: totals.last_upstream_status,
                attempts: totals.upstream_failures,
                message: format!(
                    "the agent exited with {} after the model API failed {} of its requests",
                    exit.exit_code, totals.upstream_failures
                ),
            }));
        }
        Ok(())
    }
}
