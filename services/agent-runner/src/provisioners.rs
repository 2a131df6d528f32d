//! The provisioner clients a runner uses: one per replica, connected when first asked for.

use crate::error::AgentError;
use forkyard_proto::sandbox::v1::sandbox_provisioner_client::SandboxProvisionerClient;
use std::time::Duration;
// Traced: calls are spans of the agent's activity span and carry the trace onward.
use forkyard_common::{
    grpc_telemetry::{TracedChannel as Channel, traced_channel},
    pool::ChannelPool,
};

/// One lazily-connected channel per provisioner replica; a sandbox's commands go to the
/// replica that owns it (`sandbox_endpoint`), else to the configured default.
#[derive(Clone)]
pub struct Provisioners {
    default_endpoint: String,
    channels: ChannelPool,
}

impl Provisioners {
    pub fn new(default_endpoint: String) -> Self {
        Self {
            default_endpoint,
            channels: ChannelPool::new(1024),
        }
    }

    pub fn client_for(
        &self,
        endpoint: &str,
    ) -> Result<(SandboxProvisionerClient<Channel>, String), AgentError> {
        let endpoint = if endpoint.is_empty() {
            self.default_endpoint.clone()
        } else {
            endpoint.to_owned()
        };
        let channel = self.channels.get_or(&endpoint, || {
            let c = forkyard_common::tls::endpoint(&endpoint)
                .map_err(|e| {
                    AgentError::InvalidArgument(format!("sandbox_endpoint: {endpoint:?}: {e}"))
                })?
                .connect_timeout(Duration::from_secs(5))
                .connect_lazy();
            Ok::<_, AgentError>(traced_channel(c))
        })?;
        let client = SandboxProvisionerClient::new(channel).max_decoding_message_size(64 << 20);
        Ok((client, endpoint))
    }
}
