//! The gateway client: connected with the API key and the gateway's CA, and a failed
//! call's status as the CLI reports it. Both the subcommands and `watch` call the
//! gateway, so neither owns the client.

use forkyard_proto::gateway::v1::gateway_client::GatewayClient;
use std::time::Duration;
use tonic::{
    metadata::MetadataValue,
    service::{Interceptor, interceptor::InterceptedService},
    transport::Channel,
};

pub type Client = GatewayClient<InterceptedService<Channel, Bearer>>;

/// Adds `authorization: Bearer <key>` to every call when a key is configured.
#[derive(Clone)]
pub struct Bearer(Option<MetadataValue<tonic::metadata::Ascii>>);

impl Bearer {
    pub fn new(key: Option<&str>) -> anyhow::Result<Self> {
        let value = key
            .map(str::trim)
            .filter(|k| !k.is_empty())
            .map(|k| {
                format!("Bearer {k}").parse().map_err(|_| {
                    anyhow::anyhow!("--api-key (FORKYARD_API_KEY): not a printable ASCII key")
                })
            })
            .transpose()?;
        Ok(Self(value))
    }
}

impl Interceptor for Bearer {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(v) = &self.0 {
            req.metadata_mut().insert("authorization", v.clone());
        }
        Ok(req)
    }
}

pub async fn connect(
    endpoint: &str,
    api_key: Option<&str>,
    gateway_ca: Option<&std::path::Path>,
) -> anyhow::Result<Client> {
    let bearer = Bearer::new(api_key)?;
    let channel = channel(endpoint, gateway_ca).await?;
    Ok(GatewayClient::with_interceptor(channel, bearer).max_decoding_message_size(64 << 20))
}

/// A connection to the gateway at `endpoint` (TLS with `gateway_ca` for `https://`),
/// for any of the services it serves.
pub async fn channel(
    endpoint: &str,
    gateway_ca: Option<&std::path::Path>,
) -> anyhow::Result<Channel> {
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
    ep.connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .map_err(|e| {
            anyhow::anyhow!(
                "cannot reach the gateway at {endpoint}: {e} (is the stack up? `make up`)"
            )
        })
}

pub fn status_error(s: tonic::Status) -> anyhow::Error {
    anyhow::anyhow!("{}: {}", s.code().description(), s.message())
}
