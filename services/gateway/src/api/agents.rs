//! What the gateway asks the agent runner: whether it can run an agent spec (at launch,
//! since only the runner holds the model API keys) and a fork's transcript (for
//! GetForkResult; transcripts live in the runner's artifact store, never in workflow
//! state).

use crate::error::GatewayError;
use forkyard_proto::{
    agent::v1::{CheckDriverRequest, GetTranscriptRequest, agent_runner_client::AgentRunnerClient},
    common::v1::AgentSpec,
};
use std::time::Duration;
// Traced: the runner's spans join the LaunchRun / GetForkResult trace.
use forkyard_common::grpc_telemetry::{TracedChannel as Channel, traced_channel};
use tonic::Code;

/// Most transcript bytes GetForkResult returns: gRPC clients refuse messages above 4 MiB
/// by default, and the rest of the result needs room too.
const MAX_TRANSCRIPT_BYTES: usize = 3 << 20;

/// Whole lines up to the cap, then a line saying how much was left out.
fn cap(jsonl: String) -> String {
    if jsonl.len() <= MAX_TRANSCRIPT_BYTES {
        return jsonl;
    }
    let mut end = MAX_TRANSCRIPT_BYTES;
    while !jsonl.is_char_boundary(end) {
        end -= 1;
    }
    let cut = jsonl[..end].rfind('\n').map_or(0, |i| i + 1);
    let mut out = jsonl[..cut].to_owned();
    out.push_str(&format!(
        "{{\"type\":\"truncated\",\"omitted_bytes\":{}}}\n",
        jsonl.len() - cut
    ));
    out
}

#[derive(Clone)]
pub struct AgentRunnerLink {
    channel: Channel,
}

impl AgentRunnerLink {
    /// A lazily connected link to the runner at `addr`.
    pub fn new(addr: &str) -> Result<Self, String> {
        let channel = forkyard_common::tls::endpoint(addr)
            .map_err(|e| {
                format!(
                    "--agent-runner-addr (FORKYARD_AGENT_RUNNER_ADDR) {addr:?} is not a URL: {e}"
                )
            })?
            .connect_timeout(Duration::from_secs(3))
            .timeout(Duration::from_secs(10))
            .connect_lazy();
        Ok(Self {
            channel: traced_channel(channel),
        })
    }

    fn client(&self) -> AgentRunnerClient<Channel> {
        AgentRunnerClient::new(self.channel.clone()).max_decoding_message_size(32 << 20)
    }

    /// INVALID_ARGUMENT for an unknown driver or model alias, FAILED_PRECONDITION naming
    /// the variable for a missing API key, UNAVAILABLE when the runner cannot be asked.
    /// The command driver needs nothing from the runner and is not asked about.
    pub async fn check(&self, agent: &AgentSpec) -> Result<(), GatewayError> {
        if agent.driver.is_empty() || agent.driver == "command" {
            return Ok(());
        }
        let req = CheckDriverRequest {
            agent: Some(agent.clone()),
        };
        match self.client().check_driver(req).await {
            Ok(_) => Ok(()),
            Err(s) => Err(match s.code() {
                Code::InvalidArgument => GatewayError::InvalidArgument(s.message().to_owned()),
                Code::FailedPrecondition => {
                    GatewayError::FailedPrecondition(s.message().to_owned())
                }
                _ => GatewayError::Unavailable(format!(
                    "agent runner cannot check the {} driver: {}",
                    agent.driver,
                    s.message()
                )),
            }),
        }
    }

    /// The fork's transcript (JSON lines), or empty when the runner has none.
    pub async fn transcript(&self, run_id: &str, fork: u32) -> String {
        let req = GetTranscriptRequest {
            run_id: run_id.to_owned(),
            fork,
            attempt: 0,
        };
        match self.client().get_transcript(req).await {
            Ok(r) => cap(r.into_inner().jsonl),
            Err(s) if s.code() == Code::NotFound => String::new(),
            Err(s) => {
                tracing::warn!(run_id, fork, error = %s.message(), "transcript not available from the agent runner");
                String::new()
            }
        }
    }
}

impl super::GatewayService {
    /// Refuse a launch whose agent spec the runner cannot run (see `AgentRunnerLink::check`).
    pub(super) async fn check_agent(
        &self,
        spec: &forkyard_proto::gateway::v1::RunSpec,
    ) -> Result<(), GatewayError> {
        match (&self.agent_runner, &spec.agent) {
            (Some(link), Some(agent)) => link.check(agent).await,
            _ => Ok(()),
        }
    }

    /// Fill in the fork's transcript from the runner; a fork that never started has none.
    pub(super) async fn attach_transcript(
        &self,
        run_id: &str,
        result: &mut forkyard_proto::common::v1::ForkResult,
    ) {
        if let Some(link) = &self.agent_runner
            && (result.started_unix_ms > 0 || !result.sandbox_id.is_empty())
        {
            result.transcript = link.transcript(run_id, result.fork).await;
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn long_transcripts_are_cut_at_a_line() {
        let line = format!(
            "{{\"type\":\"message\",\"pad\":\"{}\"}}\n",
            "x".repeat(1000)
        );
        let long = line.repeat(4000);
        let cut = super::cap(long.clone());
        assert!(cut.len() <= super::MAX_TRANSCRIPT_BYTES + 100);
        let last = cut.lines().last().unwrap();
        assert!(last.starts_with("{\"type\":\"truncated\""), "{last}");
        assert!(
            cut.lines()
                .all(|l| serde_json::from_str::<serde_json::Value>(l).is_ok())
        );
        assert_eq!(super::cap(line.clone()), line);
    }
}
