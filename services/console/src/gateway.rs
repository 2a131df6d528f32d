//! The gateway's gRPC API, called with the visitor's API key.

use crate::ConsoleError;
use forkyard_proto::gateway::v1::gateway_client::GatewayClient;
use std::time::Duration;
use tonic::transport::{Channel, Endpoint};

/// How long one unary call may take before the page says the gateway did not answer.
const CALL_TIMEOUT: Duration = Duration::from_secs(20);

/// A caller's API key. `Debug` shows its length only, so no log line carries it.
#[derive(Clone, PartialEq, Eq)]
pub struct ApiKey(String);

impl ApiKey {
    /// A key as typed or read from the cookie: printable ASCII without the characters a
    /// cookie value or an HTTP header cannot hold.
    pub fn parse(text: &str) -> Option<Self> {
        let key = text.trim();
        let ok = !key.is_empty()
            && key.len() <= 512
            && key
                .bytes()
                .all(|b| b.is_ascii_graphic() && !b"\",;\\".contains(&b));
        ok.then(|| Self(key.to_owned()))
    }

    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ApiKey(<{} bytes, redacted>)", self.0.len())
    }
}

/// One connection to the gateway, shared by every visitor; each call carries its
/// caller's key.
#[derive(Clone)]
pub struct Gateway {
    channel: Channel,
}

impl Gateway {
    /// Connects on first use, so the console starts (and says where it listens) while
    /// the gateway is still starting.
    pub fn connect_lazy(endpoint: &str) -> Result<Self, String> {
        let channel = Endpoint::from_shared(endpoint.to_owned())
            .map_err(|e| format!("{endpoint:?}: {e}"))?
            .connect_timeout(Duration::from_secs(5))
            .connect_lazy();
        Ok(Self { channel })
    }

    pub fn client(&self) -> GatewayClient<Channel> {
        // Patches can be large (GetForkResult caps them far above tonic's 4 MiB default).
        GatewayClient::new(self.channel.clone()).max_decoding_message_size(128 << 20)
    }
}

/// A request as `key`'s owner (no key: the gateway's `--auth none` decides).
pub fn request<T>(key: Option<&ApiKey>, msg: T) -> Result<tonic::Request<T>, ConsoleError> {
    let mut req = tonic::Request::new(msg);
    if let Some(key) = key {
        let value = format!("Bearer {}", key.expose())
            .parse()
            .map_err(|_| ConsoleError::Unauthenticated("not an api key".into()))?;
        req.metadata_mut().insert("authorization", value);
    }
    Ok(req)
}

/// [`request`] for a unary call: bounded in time.
pub fn unary<T>(key: Option<&ApiKey>, msg: T) -> Result<tonic::Request<T>, ConsoleError> {
    let mut req = request(key, msg)?;
    req.set_timeout(CALL_TIMEOUT);
    Ok(req)
}

#[cfg(test)]
mod tests {
    use super::ApiKey;

    #[test]
    fn keys_that_cannot_be_a_cookie_or_header_are_refused() {
        assert!(ApiKey::parse("fyk_abc_def").is_some());
        assert_eq!(ApiKey::parse("  fyk_a  ").unwrap().expose(), "fyk_a");
        for bad in ["", "a b", "a;b", "a\"b", "a,b", "é", "a\nb"] {
            assert!(ApiKey::parse(bad).is_none(), "{bad:?}");
        }
    }

    #[test]
    fn debug_never_shows_the_key() {
        let k = ApiKey::parse("fyk_secret_value").unwrap();
        assert!(!format!("{k:?}").contains("secret"));
    }
}
