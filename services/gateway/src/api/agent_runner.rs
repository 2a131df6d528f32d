//! What the gateway asks the agent runner: whether it can run an agent spec (at launch,
//! since only the runner holds the model API keys) and a fork's transcript (for
//! GetForkResult; transcripts live in the runner's artifact store, never in workflow
//! state).

use crate::error::GatewayError;
use forkyard_proto::{
    agent::v1::{
        CaptureBranchPointRequest, CaptureBranchPointResponse, CheckDriverRequest,
        GetTranscriptRequest, agent_runner_client::AgentRunnerClient,
    },
    common::v1::AgentSpec,
};
use std::{sync::Arc, time::Duration};
// Traced: the runner's spans join the LaunchRun / GetForkResult trace.
use forkyard_common::{
    grpc_telemetry::{TracedChannel as Channel, traced_channel},
    pool::ChannelPool,
};
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

/// Channels to runner replicas other than the configured address, at most this many.
const MAX_REPLICA_CHANNELS: usize = 256;

#[derive(Clone)]
pub struct AgentRunnerLink {
    addr: String,
    /// Every replica of the configured address (looked up when a transcript's replica
    /// is not known or no longer has it).
    targets: Arc<Vec<forkyard_common::discovery::Target>>,
    channel: Channel,
    /// Transcripts stay with the replica that ran the agent: one pooled channel per
    /// advertised endpoint (`ForkResult.transcript_endpoint`).
    replicas: ChannelPool,
}

fn timeouts(ep: tonic::transport::Endpoint) -> tonic::transport::Endpoint {
    ep.connect_timeout(Duration::from_secs(3))
        .timeout(Duration::from_secs(10))
}

fn lazy(addr: &str) -> Result<Channel, String> {
    Ok(traced_channel(
        timeouts(forkyard_common::tls::endpoint(addr)?).connect_lazy(),
    ))
}

/// A capture's channel deadline, past any wait a runner takes (600 s) and its snapshot:
/// the caller's own call deadline ends it first (`GatewayService::bounded`).
const CAPTURE_DEADLINE: Duration = Duration::from_secs(660);

/// What one replica said about a transcript.
enum Asked {
    Found(String),
    NotThere,
    Failed(String),
}

impl AgentRunnerLink {
    /// A lazily connected link to the runner at `addr`.
    pub fn new(addr: &str) -> Result<Self, String> {
        const FLAG: &str = "--agent-runner-addr (FORKYARD_AGENT_RUNNER_ADDR)";
        let targets = forkyard_common::discovery::parse(FLAG, addr)?;
        let channel = traced_channel(forkyard_common::discovery::balanced(FLAG, addr, timeouts)?);
        Ok(Self {
            addr: addr.trim().to_owned(),
            targets: Arc::new(targets),
            channel,
            replicas: ChannelPool::new(MAX_REPLICA_CHANNELS),
        })
    }

    fn client(&self) -> AgentRunnerClient<Channel> {
        Self::client_on(self.channel.clone())
    }

    fn client_on(channel: Channel) -> AgentRunnerClient<Channel> {
        AgentRunnerClient::new(channel).max_decoding_message_size(32 << 20)
    }

    /// A client for the replica at `endpoint` (empty or the configured address: the
    /// configured channel).
    fn client_for(&self, endpoint: &str) -> Result<AgentRunnerClient<Channel>, String> {
        let endpoint = endpoint.trim();
        if endpoint.is_empty() || endpoint == self.addr {
            return Ok(self.client());
        }
        self.pooled(endpoint, || lazy(endpoint))
    }

    /// The pooled channel for `key` (a replica's URL), made by `make` the first time.
    fn pooled(
        &self,
        key: &str,
        make: impl FnOnce() -> Result<Channel, String>,
    ) -> Result<AgentRunnerClient<Channel>, String> {
        Ok(Self::client_on(self.replicas.get_or(key, make)?))
    }

    /// INVALID_ARGUMENT for an unknown driver or model alias, FAILED_PRECONDITION naming
    /// the variable for a missing API key, UNAVAILABLE when the runner cannot be asked.
    /// The command driver needs nothing from the runner and is not asked about.
    pub async fn check(&self, agent: &AgentSpec) -> Result<(), GatewayError> {
        if forkyard_proto::Driver::parse(&agent.driver) == Some(forkyard_proto::Driver::Command) {
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

    /// A client for one replica found by name (its certificate carries the name).
    fn client_for_replica(
        &self,
        replica: &forkyard_common::discovery::Replica,
    ) -> Result<AgentRunnerClient<Channel>, String> {
        self.pooled(&replica.url, || {
            Ok(traced_channel(
                timeouts(forkyard_common::discovery::endpoint(replica)?).connect_lazy(),
            ))
        })
    }

    async fn ask(
        client: Result<AgentRunnerClient<Channel>, String>,
        req: GetTranscriptRequest,
    ) -> Asked {
        let mut client = match client {
            Ok(c) => c,
            Err(e) => return Asked::Failed(e),
        };
        match client.get_transcript(req).await {
            Ok(r) => Asked::Found(cap(r.into_inner().jsonl)),
            Err(s) if s.code() == Code::NotFound => Asked::NotThere,
            Err(s) => Asked::Failed(s.message().to_owned()),
        }
    }

    /// A client for a capture at `url` (its own channel: a capture outlasts the others'
    /// deadline, waiting for the fork's next turn).
    fn capture_client(
        &self,
        url: &str,
        endpoint: impl FnOnce() -> Result<tonic::transport::Endpoint, String>,
    ) -> Result<AgentRunnerClient<Channel>, String> {
        self.pooled(&format!("capture {url}"), || {
            let ep = endpoint()?
                .connect_timeout(Duration::from_secs(3))
                .timeout(CAPTURE_DEADLINE);
            Ok(traced_channel(ep.connect_lazy()))
        })
    }

    /// A running fork's branch point, from the replica running its agent: the one its
    /// heartbeat names (`endpoint`), else whichever replica of the configured address
    /// has it, waiting up to `wait` for the fork's next model request.
    /// FAILED_PRECONDITION when none runs it or it ended first, DEADLINE_EXCEEDED when it
    /// asked its model nothing in time.
    pub async fn capture(
        &self,
        run_id: &str,
        fork: u32,
        endpoint: &str,
        wait: Duration,
    ) -> Result<CaptureBranchPointResponse, GatewayError> {
        let req = CaptureBranchPointRequest {
            run_id: run_id.to_owned(),
            fork,
            wait_secs: u32::try_from(wait.as_secs().clamp(1, 600)).unwrap_or(600),
        };
        let endpoint = endpoint.trim();
        if !endpoint.is_empty() {
            let client = self.capture_client(endpoint, || forkyard_common::tls::endpoint(endpoint));
            if let Some(answer) = Self::ask_capture(client, req.clone()).await {
                return answer;
            }
        }
        let (replicas, _) = forkyard_common::discovery::replicas(&self.targets).await;
        for replica in replicas.iter().filter(|r| r.url != endpoint) {
            let client = self.capture_client(&replica.url, || {
                forkyard_common::discovery::endpoint(replica)
            });
            if let Some(answer) = Self::ask_capture(client, req.clone()).await {
                return answer;
            }
        }
        Err(GatewayError::FailedPrecondition(format!(
            "no agent runner runs the agent of fork {fork} now (it is starting, or ending); branch it once it runs, or from its end"
        )))
    }

    /// One replica's answer to a capture; none when it runs no agent of the fork.
    async fn ask_capture(
        client: Result<AgentRunnerClient<Channel>, String>,
        req: CaptureBranchPointRequest,
    ) -> Option<Result<CaptureBranchPointResponse, GatewayError>> {
        let mut client = match client {
            Ok(c) => c,
            Err(e) => return Some(Err(GatewayError::Unavailable(format!("agent runner: {e}")))),
        };
        match client.capture_branch_point(req).await {
            Ok(r) => Some(Ok(r.into_inner())),
            Err(s) if s.code() == Code::NotFound => None,
            Err(s) => Some(Err(match s.code() {
                Code::FailedPrecondition | Code::InvalidArgument => {
                    GatewayError::FailedPrecondition(s.message().to_owned())
                }
                Code::DeadlineExceeded => GatewayError::DeadlineExceeded(s.message().to_owned()),
                _ => GatewayError::Unavailable(format!(
                    "agent runner cannot capture a branch point: {}",
                    s.message()
                )),
            })),
        }
    }

    /// The fork's transcript (JSON lines): from the replica at `endpoint`, the one that
    /// ran the agent; when that is not known (a fork cancelled mid-agent) or it does not
    /// have it, from whichever replica of the configured address does. Empty when none
    /// has it or none can be reached: a replica that is gone takes its transcripts with
    /// it, and the rest of the result still answers (with a warning logged).
    pub async fn transcript(&self, run_id: &str, fork: u32, endpoint: &str) -> String {
        let req = GetTranscriptRequest {
            run_id: run_id.to_owned(),
            fork,
            attempt: 0,
        };
        let endpoint = endpoint.trim();
        if !endpoint.is_empty() {
            match Self::ask(self.client_for(endpoint), req.clone()).await {
                Asked::Found(t) => return t,
                Asked::NotThere => {}
                Asked::Failed(e) => {
                    tracing::warn!(run_id, fork, endpoint, error = %e, "transcript not available from the replica that ran the agent; asking every replica");
                }
            }
        }
        let (replicas, lookup_errors) = forkyard_common::discovery::replicas(&self.targets).await;
        let mut failed = lookup_errors;
        for replica in replicas.iter().filter(|r| r.url != endpoint) {
            match Self::ask(self.client_for_replica(replica), req.clone()).await {
                Asked::Found(t) => return t,
                Asked::NotThere => {}
                Asked::Failed(e) => failed.push(format!("{}: {e}", replica.url)),
            }
        }
        if !failed.is_empty() {
            tracing::warn!(run_id, fork, addr = %self.addr, errors = ?failed, "transcript not available from the agent runner");
        }
        String::new()
    }
}

#[cfg(test)]
mod tests {
    use super::AgentRunnerLink;

    fn pooled(link: &AgentRunnerLink) -> usize {
        link.replicas.len()
    }

    #[tokio::test]
    async fn one_pooled_channel_per_replica_endpoint() {
        let link = AgentRunnerLink::new("http://127.0.0.1:50053").unwrap();
        // Empty (older results) and the configured address use the configured channel.
        link.client_for("").unwrap();
        link.client_for("http://127.0.0.1:50053").unwrap();
        assert_eq!(pooled(&link), 0);
        link.client_for("http://10.0.0.7:50053").unwrap();
        link.client_for("http://10.0.0.7:50053").unwrap();
        link.clone().client_for("http://10.0.0.8:50053").unwrap();
        assert_eq!(pooled(&link), 2, "clones share the pool");
        assert!(link.client_for("not a url").is_err());
        assert_eq!(pooled(&link), 2);
    }

    #[tokio::test]
    async fn an_unreachable_replica_leaves_the_transcript_empty() {
        let link = AgentRunnerLink::new("http://127.0.0.1:50053").unwrap();
        let gone = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let endpoint = format!("http://{}", gone.local_addr().unwrap());
        drop(gone);
        assert_eq!(link.transcript("run-1", 1, &endpoint).await, "");
        assert_eq!(link.transcript("run-1", 1, "::bad::").await, "");
    }
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
