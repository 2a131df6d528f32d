//! The fork's sandbox control calls (create, health check, collect patch, destroy), run
//! as local activities of the gateway's worker that call sandbox-provisioner over gRPC.
//!
//! Why local: these calls take milliseconds, and as regular activities each one cost a
//! matched task, three history events and a workflow-task round trip on the Temporal
//! server, which on this kind of machine was the whole limit of fan-out (bench-fanout:
//! about 100 ms of server CPU per fork, 10 forks/s) and put four server round trips
//! between `LaunchRun` and a ready sandbox. As local activities each is one marker
//! recorded with the workflow task that ran it. What stays a regular activity on the
//! provisioner's queues is what runs long and must heartbeat: the verify command.
//!
//! Routing: creates go to any replica of `--provisioner-addr` (a comma-separated list is
//! balanced); every later call goes to the sandbox's `owner_endpoint`, the replica that
//! holds it, over a channel kept per endpoint.
//!
//! Safety on a crash: a local activity whose marker was not recorded runs again when the
//! workflow task is retried. Create carries an idempotency key (the provisioner returns
//! the sandbox the first call made), and health, patch and destroy are idempotent.

use forkyard_common::{
    activity::{non_retryable, retryable},
    grpc_telemetry::{TracedChannel, traced_channel},
};
use forkyard_proto::{
    activities::errors,
    sandbox::v1::{
        CollectPatchRequest, CollectPatchResponse, CreateSandboxRequest, DestroySandboxRequest,
        DestroySandboxResponse, HealthCheckRequest, Sandbox,
        sandbox_provisioner_client::SandboxProvisionerClient,
    },
};
use serde::{Deserialize, Serialize};
use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, SystemTime},
};
use temporalio_macros::activities;
use temporalio_sdk::activities::{ActivityContext, ActivityError};
use tonic::{Code, Status, transport::Channel};

/// Longest a create (a clone of the repository) may take before it is retried.
const CREATE_DEADLINE: Duration = Duration::from_secs(300);
/// Longest any other control call may take.
const CALL_DEADLINE: Duration = Duration::from_secs(60);

type Client = SandboxProvisionerClient<TracedChannel>;

pub struct SandboxLocal {
    creates: Client,
    owners: Mutex<HashMap<String, Client>>,
}

/// A call about an existing sandbox, addressed to the replica that owns it.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct AtOwner {
    /// The sandbox's `owner_endpoint`; empty = the create address.
    pub endpoint: String,
    pub sandbox_id: String,
    /// Destroy: why (kept in the provisioner's log).
    pub reason: String,
}

/// A health check's answer, with the moment the gateway got it: the fork's
/// `sandbox_ready_unix_ms` (workflow time would be the start of the workflow task).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Health {
    pub healthy: bool,
    pub detail: String,
    pub checked_unix_ms: i64,
}

fn endpoint(addr: &str, deadline: Duration) -> Result<tonic::transport::Endpoint, String> {
    Ok(forkyard_common::tls::endpoint(addr)?
        .connect_timeout(Duration::from_secs(5))
        .timeout(deadline))
}

impl SandboxLocal {
    /// `addrs`: sandbox-provisioner's gRPC address, or several separated by commas (new
    /// sandboxes are spread over them). Channels connect on first use.
    pub fn new(addrs: &str) -> Result<Self, String> {
        let list = addrs
            .split(',')
            .map(str::trim)
            .filter(|a| !a.is_empty())
            .map(|a| endpoint(a, CREATE_DEADLINE))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("--provisioner-addr (FORKYARD_PROVISIONER_ADDR): {e}"))?;
        let channel = match list.len() {
            0 => {
                return Err(
                    "--provisioner-addr (FORKYARD_PROVISIONER_ADDR) names no address".into(),
                );
            }
            1 => list[0].connect_lazy(),
            _ => Channel::balance_list(list.into_iter()),
        };
        Ok(Self {
            creates: SandboxProvisionerClient::new(traced_channel(channel)),
            owners: Mutex::new(HashMap::new()),
        })
    }

    fn owner(&self, addr: &str) -> Result<Client, ActivityError> {
        if addr.is_empty() {
            return Ok(self.creates.clone());
        }
        let mut owners = self.owners.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = owners.get(addr) {
            return Ok(c.clone());
        }
        let ep = endpoint(addr, CALL_DEADLINE).map_err(|e| {
            non_retryable(
                errors::INVALID_INPUT,
                format!("owner endpoint {addr:?}: {e}"),
            )
        })?;
        let client = SandboxProvisionerClient::new(traced_channel(ep.connect_lazy()));
        owners.insert(addr.to_owned(), client.clone());
        Ok(client)
    }
}

/// The provisioner's status codes back into the failures its own activities raise
/// (see sandbox-provisioner's error mapping), so the retry table applies unchanged.
fn failure(what: &str, status: Status) -> ActivityError {
    let msg = format!("{what}: {}", status.message());
    match status.code() {
        Code::InvalidArgument => non_retryable(errors::INVALID_INPUT, msg),
        Code::NotFound => non_retryable(errors::NOT_FOUND, msg),
        Code::PermissionDenied | Code::Unauthenticated => non_retryable(errors::SANDBOX_AUTH, msg),
        // A repository that cannot be cloned, or a sandbox in the wrong state.
        Code::FailedPrecondition => non_retryable("RepoUnavailable", msg),
        _ => retryable("SandboxUnavailable", msg),
    }
}

fn now_unix_ms() -> i64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or_default()
}

#[activities]
impl SandboxLocal {
    #[activity(name = "SandboxLocal.create")]
    pub async fn create(
        self: Arc<Self>,
        _ctx: ActivityContext,
        req: CreateSandboxRequest,
    ) -> Result<Sandbox, ActivityError> {
        self.creates
            .clone()
            .create_sandbox(req)
            .await
            .map(tonic::Response::into_inner)
            .map_err(|s| failure("create sandbox", s))
    }

    #[activity(name = "SandboxLocal.health")]
    pub async fn health(
        self: Arc<Self>,
        _ctx: ActivityContext,
        at: AtOwner,
    ) -> Result<Health, ActivityError> {
        let req = HealthCheckRequest {
            sandbox_id: at.sandbox_id,
        };
        let out = self
            .owner(&at.endpoint)?
            .health_check(req)
            .await
            .map(tonic::Response::into_inner)
            .map_err(|s| failure("health check", s))?;
        Ok(Health {
            healthy: out.healthy,
            detail: out.detail,
            checked_unix_ms: now_unix_ms(),
        })
    }

    #[activity(name = "SandboxLocal.collect_patch")]
    pub async fn collect_patch(
        self: Arc<Self>,
        _ctx: ActivityContext,
        at: AtOwner,
    ) -> Result<CollectPatchResponse, ActivityError> {
        let req = CollectPatchRequest {
            sandbox_id: at.sandbox_id,
            max_bytes: 0,
        };
        self.owner(&at.endpoint)?
            .collect_patch(req)
            .await
            .map(tonic::Response::into_inner)
            .map_err(|s| failure("collect patch", s))
    }

    /// A sandbox already gone counts as destroyed.
    #[activity(name = "SandboxLocal.destroy")]
    pub async fn destroy(
        self: Arc<Self>,
        _ctx: ActivityContext,
        at: AtOwner,
    ) -> Result<DestroySandboxResponse, ActivityError> {
        let req = DestroySandboxRequest {
            sandbox_id: at.sandbox_id,
            reason: at.reason,
        };
        match self.owner(&at.endpoint)?.destroy_sandbox(req).await {
            Ok(r) => Ok(r.into_inner()),
            Err(s) if s.code() == Code::NotFound => Ok(DestroySandboxResponse::default()),
            Err(s) => Err(failure("destroy sandbox", s)),
        }
    }
}
