//! The fork's sandbox control calls (collect patch, destroy; create and health check
//! are a wave's, see `super::wave`), run as local activities of the gateway's worker that
//! call sandbox-provisioner over gRPC.
//!
//! Why local: these calls take milliseconds, and as regular activities each one cost a
//! matched task, three history events and a workflow-task round trip on the Temporal
//! server, which on this kind of machine was the whole limit of fan-out (bench-fanout;
//! figures in docs/performance.md) and put four server round trips
//! between `LaunchRun` and a ready sandbox. As local activities each is one marker
//! recorded with the workflow task that ran it. What stays a regular activity on the
//! provisioner's queues is what runs long and must heartbeat: the verify command.
//!
//! Routing: creates go to any replica of `--provisioner-addr` (balanced over every
//! address its names resolve to, followed as replicas come and go); every later call goes to the sandbox's `owner_endpoint`, the replica that
//! holds it, over a channel kept per endpoint.
//!
//! Safety on a crash: a local activity whose marker was not recorded runs again when the
//! workflow task is retried. Create carries an idempotency key (the provisioner returns
//! the sandbox the first call made), and health, patch and destroy are idempotent.

use crate::lifecycle::{AtOwner, SANDBOX_LOST};
use forkyard_common::{
    activity::{non_retryable, retryable},
    grpc_telemetry::{TracedChannel, traced_channel},
    pool::ChannelPool,
};
use forkyard_proto::{
    activities::errors,
    sandbox::v1::{
        CollectPatchRequest, CollectPatchResponse, DeleteSnapshotRequest, DeleteSnapshotResponse,
        DestroySandboxRequest, DestroySandboxResponse, PersistWorkspaceRequest,
        PersistWorkspaceResponse, sandbox_provisioner_client::SandboxProvisionerClient,
    },
};
use std::{sync::Arc, time::Duration};
use temporalio_macros::activities;
use temporalio_sdk::activities::{ActivityContext, ActivityError};
use tonic::{Code, Status};

/// Longest a create (a clone of the repository) may take before it is retried.
const CREATE_DEADLINE: Duration = Duration::from_secs(300);
/// Longest any other control call may take.
const CALL_DEADLINE: Duration = Duration::from_secs(60);

pub(crate) type Client = SandboxProvisionerClient<TracedChannel>;

/// Cheap to clone: the clones share the channels.
#[derive(Clone)]
pub struct SandboxLocal {
    creates: Client,
    owners: ChannelPool,
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
        let channel = forkyard_common::discovery::balanced(
            "--provisioner-addr (FORKYARD_PROVISIONER_ADDR)",
            addrs,
            |ep| {
                ep.connect_timeout(Duration::from_secs(5))
                    .timeout(CREATE_DEADLINE)
            },
        )?;
        Ok(Self {
            creates: SandboxProvisionerClient::new(traced_channel(channel)),
            owners: ChannelPool::new(1024),
        })
    }

    /// Where new sandboxes are made.
    pub(crate) fn creates(&self) -> Client {
        self.creates.clone()
    }

    /// The replica that owns a sandbox; an `owner_endpoint` that is no URL is refused.
    pub(crate) fn owner_of(&self, addr: &str) -> Result<Client, String> {
        if addr.is_empty() {
            return Ok(self.creates.clone());
        }
        let channel = self.owners.get_or(addr, || {
            let ep = endpoint(addr, CALL_DEADLINE)
                .map_err(|e| format!("owner endpoint {addr:?}: {e}"))?;
            Ok::<_, String>(traced_channel(ep.connect_lazy()))
        })?;
        Ok(SandboxProvisionerClient::new(channel))
    }

    fn owner(&self, addr: &str) -> Result<Client, ActivityError> {
        self.owner_of(addr)
            .map_err(|e| non_retryable(errors::INVALID_INPUT, e))
    }

    /// Destroy a sandbox at the replica that owns it; one already gone counts as
    /// destroyed.
    pub(crate) async fn destroy_at(
        &self,
        at: AtOwner,
    ) -> Result<DestroySandboxResponse, ActivityError> {
        let owner = self.owner(&at.endpoint)?;
        destroy_with(owner, at)
            .await
            .map_err(|s| failure("destroy sandbox", s))
    }
}

/// Destroy a sandbox through `owner`, the replica that holds it; one already gone
/// counts as destroyed.
pub(crate) async fn destroy_with(
    mut owner: Client,
    at: AtOwner,
) -> Result<DestroySandboxResponse, Status> {
    let req = DestroySandboxRequest {
        sandbox_id: at.sandbox_id,
        reason: at.reason,
    };
    match owner.destroy_sandbox(req).await {
        Ok(r) => Ok(r.into_inner()),
        Err(s) if s.code() == Code::NotFound => Ok(DestroySandboxResponse::default()),
        Err(s) => Err(s),
    }
}

/// The provisioner's status codes as the error types its own activities raise (see
/// sandbox-provisioner's error mapping), and whether trying again may help, so the retry
/// table applies unchanged.
pub(crate) fn error_type(status: &Status) -> (&'static str, bool) {
    if status.metadata().get(errors::DRAINING_METADATA).is_some() {
        return (errors::SANDBOX_DRAINING, true);
    }
    match status.code() {
        Code::InvalidArgument => (errors::INVALID_INPUT, false),
        Code::NotFound => (errors::NOT_FOUND, false),
        Code::PermissionDenied | Code::Unauthenticated => (errors::SANDBOX_AUTH, false),
        // A repository that cannot be cloned, or a sandbox in the wrong state.
        Code::FailedPrecondition => ("RepoUnavailable", false),
        _ => ("SandboxUnavailable", true),
    }
}

/// Whether a failed create was refused by the backend itself (its capacity, quota or
/// outage), so that another backend may take the fork: RESOURCE_EXHAUSTED, or the
/// provisioner saying (its `ErrorInfo`) that the backend is unavailable or cannot serve
/// the sandbox. Not a provisioner that did not answer (every backend is behind it), nor
/// a draining replica (another replica takes the create), nor a repository that cannot
/// be cloned, nor bad input: those fail the same on every backend.
pub(crate) fn backend_refused(status: &Status) -> bool {
    const PROVISIONER: &str = "sandbox-provisioner.forkyard";
    if status.code() == Code::ResourceExhausted {
        return true;
    }
    let Some((domain, reason)) = forkyard_common::status::reason_of(status) else {
        return false;
    };
    domain == PROVISIONER
        && matches!(
            (status.code(), reason.as_str()),
            (Code::Unavailable, "BACKEND_UNAVAILABLE")
                | (Code::FailedPrecondition, "SANDBOX_UNAVAILABLE")
        )
}

/// Whether a sandbox call's final failure means the sandbox is gone: its replica
/// answered without it, or did not answer through the call's retries (a killed
/// provisioner takes its sandboxes' processes with it). The run starts such a fork
/// again on a new sandbox ([`SANDBOX_LOST`] in its error), as it does one
/// whose agent lost its sandbox, instead of failing a fork whose agent did its work.
pub(crate) fn lost(status: &Status) -> bool {
    status.code() == Code::NotFound || error_type(status).1
}

/// A collect-patch failure's message: naming a lost sandbox so (see [`lost`]).
pub(crate) fn patch_failure_message(status: &Status) -> String {
    if lost(status) {
        format!("collect patch: {}: {}", SANDBOX_LOST, status.message())
    } else {
        format!("collect patch: {}", status.message())
    }
}

fn failure(what: &str, status: Status) -> ActivityError {
    failure_saying(format!("{what}: {}", status.message()), &status)
}

/// The activity error for `status`, retryable as [`error_type`] says, with `msg`.
fn failure_saying(msg: String, status: &Status) -> ActivityError {
    match error_type(status) {
        (ty, true) => retryable(ty, msg),
        (ty, false) => non_retryable(ty, msg),
    }
}

#[activities]
impl SandboxLocal {
    #[activity(name = "SandboxLocal.collect_patch")]
    pub async fn collect_patch(
        self: Arc<Self>,
        _ctx: ActivityContext,
        at: AtOwner,
    ) -> Result<CollectPatchResponse, ActivityError> {
        let req = CollectPatchRequest {
            sandbox_id: at.sandbox_id,
            max_bytes: 0,
            ..Default::default()
        };
        self.owner(&at.endpoint)?
            .collect_patch(req)
            .await
            .map(tonic::Response::into_inner)
            .map_err(|s| failure_saying(patch_failure_message(&s), &s))
    }

    /// The workspace's snapshot, at its owner (a fork's branch point).
    #[activity(name = "SandboxLocal.persist")]
    pub async fn persist(
        self: Arc<Self>,
        _ctx: ActivityContext,
        at: AtOwner,
    ) -> Result<PersistWorkspaceResponse, ActivityError> {
        let req = PersistWorkspaceRequest {
            sandbox_id: at.sandbox_id,
        };
        self.owner(&at.endpoint)?
            .persist_workspace(req)
            .await
            .map(tonic::Response::into_inner)
            .map_err(|s| failure("snapshot workspace", s))
    }

    /// Remove a snapshot at the replica holding it (`at.sandbox_id` is the snapshot's
    /// id); one already gone counts as removed.
    #[activity(name = "SandboxLocal.delete_snapshot")]
    pub async fn delete_snapshot(
        self: Arc<Self>,
        _ctx: ActivityContext,
        at: AtOwner,
    ) -> Result<DeleteSnapshotResponse, ActivityError> {
        let req = DeleteSnapshotRequest {
            snapshot_id: at.sandbox_id,
        };
        self.owner(&at.endpoint)?
            .delete_snapshot(req)
            .await
            .map(tonic::Response::into_inner)
            .map_err(|s| failure("delete snapshot", s))
    }

    /// A sandbox already gone counts as destroyed.
    #[activity(name = "SandboxLocal.destroy")]
    pub async fn destroy(
        self: Arc<Self>,
        _ctx: ActivityContext,
        at: AtOwner,
    ) -> Result<DestroySandboxResponse, ActivityError> {
        self.destroy_at(at).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_patch_the_sandbox_is_gone_for_names_it_lost_so_the_run_starts_the_fork_again() {
        for status in [
            Status::not_found("sandbox sb-1 not found"),
            Status::unavailable("dns error"),
            Status::unknown("h2 protocol error: error reading a body from connection"),
        ] {
            let msg = patch_failure_message(&status);
            assert!(
                msg.starts_with("collect patch: sandbox lost: "),
                "{:?}: {msg}",
                status.code()
            );
        }
    }

    #[test]
    fn a_patch_refused_for_what_it_is_is_not_a_lost_sandbox() {
        for status in [
            Status::failed_precondition("sandbox sb-1 is stopped"),
            Status::invalid_argument("sandbox_id: malformed"),
            Status::permission_denied("not yours"),
        ] {
            let msg = patch_failure_message(&status);
            assert!(!msg.contains(SANDBOX_LOST), "{:?}: {msg}", status.code());
        }
    }
}
