//! The gateway client: connected with the API key and the gateway's CA, and a failed
//! call's status as the CLI reports it. Both the subcommands and `watch` call the
//! gateway, so neither owns the client.

use forkyard_proto::gateway::v1::gateway_client::GatewayClient;
use std::time::Duration;
use tonic::{service::interceptor::InterceptedService, transport::Channel};

pub type Client = GatewayClient<InterceptedService<Channel, crate::keys::Bearer>>;

pub async fn connect(
    endpoint: &str,
    api_key: Option<&str>,
    gateway_ca: Option<&std::path::Path>,
) -> anyhow::Result<Client> {
    let bearer = crate::keys::Bearer::new(api_key)?;
    let mut ep = tonic::transport::Endpoint::from_shared(endpoint.to_owned())
        .map_err(|e| anyhow::anyhow!("--gateway {endpoint:?}: {e}"))?;
    if endpoint.starts_with("https://") {
        let mut tls = tonic::transport::ClientTlsConfig::new().with_native_roots();
        if let Some(ca) = gateway_ca {
            let pem = std::fs::read(ca)
                .map_err(|e| anyhow::anyhow!("--gateway-ca {}: {e}", ca.display()))?;
            tls = tls.ca_certificate(tonic::transport::Certificate::from_pem(pem));
        }
        ep = ep.tls_config(tls)?;
    }
    let channel = ep
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .map_err(|e| {
            anyhow::anyhow!(
                "cannot reach the gateway at {endpoint}: {e} (is the stack up? `make up`)"
            )
        })?;
    Ok(GatewayClient::with_interceptor(channel, bearer).max_decoding_message_size(64 << 20))
}

pub fn status_error(s: tonic::Status) -> anyhow::Error {
    anyhow::anyhow!("{}: {}", s.code().description(), s.message())
}
