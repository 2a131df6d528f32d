//! Mesh TLS: every service's gRPC server and every internal channel, from PEM files.
//!
//! Off unless `FORKYARD_TLS_CERT` is set (plain local mode stays the default for `make
//! demo`). With a certificate and key, the server speaks TLS; with a CA as well, internal
//! services refuse callers without a certificate signed by that CA (mTLS), and every
//! internal channel presents this service's certificate and trusts only that CA.
//!
//! The settings are loaded once at start-up into a process-wide value, because the
//! server bootstrap and each service's clients are built in different places and must
//! agree on one identity.

use std::{path::PathBuf, sync::OnceLock, time::Duration};
/// For the crates that serve or dial the non-gRPC mesh hop with [`MeshTls`].
pub use tokio_rustls;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity, ServerTlsConfig};

#[derive(Debug, Clone, Default, clap::Args)]
pub struct TlsArgs {
    /// PEM certificate this service presents (as a server and, with --tls-ca, as a client).
    #[arg(id = "mesh_tls_cert", long = "tls-cert", env = "FORKYARD_TLS_CERT")]
    pub cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(id = "mesh_tls_key", long = "tls-key", env = "FORKYARD_TLS_KEY")]
    pub key: Option<PathBuf>,
    /// PEM CA bundle of the mesh: peers must present a certificate it signed.
    #[arg(id = "mesh_tls_ca", long = "tls-ca", env = "FORKYARD_TLS_CA")]
    pub ca: Option<PathBuf>,
}

/// Who may call a TLS server of this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientAuth {
    /// Internal services: a client certificate signed by the mesh CA is required.
    Required,
    /// The public gateway: callers authenticate with API keys, not certificates.
    Optional,
}

/// The loaded identity (PEM bytes kept, so configs can be rebuilt per use).
#[derive(Clone)]
pub struct MeshTls {
    cert: Vec<u8>,
    key: Vec<u8>,
    ca: Option<Vec<u8>>,
    client_auth: ClientAuth,
}

impl std::fmt::Debug for MeshTls {
    // The key never reaches logs.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MeshTls")
            .field("cert_bytes", &self.cert.len())
            .field("ca", &self.ca.is_some())
            .field("client_auth", &self.client_auth)
            .finish_non_exhaustive()
    }
}

static MESH_TLS: OnceLock<Option<MeshTls>> = OnceLock::new();

fn read(setting: &str, path: &std::path::Path) -> Result<Vec<u8>, String> {
    let bytes = std::fs::read(path)
        .map_err(|e| format!("{setting} {}: cannot read: {e}", path.display()))?;
    if !String::from_utf8_lossy(&bytes).contains("-----BEGIN") {
        return Err(format!("{setting} {}: not a PEM file", path.display()));
    }
    Ok(bytes)
}

impl TlsArgs {
    /// Read the files; `None` when TLS is off. Errors name the setting.
    pub fn load(&self, client_auth: ClientAuth) -> Result<Option<MeshTls>, String> {
        match (&self.cert, &self.key) {
            (None, None) => {
                if self.ca.is_some() {
                    return Err(
                        "--tls-ca (FORKYARD_TLS_CA) is set but --tls-cert (FORKYARD_TLS_CERT) is not: \
                         mTLS needs this service's own certificate and key too"
                            .into(),
                    );
                }
                Ok(None)
            }
            (Some(_), None) => Err(
                "--tls-key (FORKYARD_TLS_KEY) is missing: --tls-cert (FORKYARD_TLS_CERT) needs its private key".into(),
            ),
            (None, Some(_)) => Err(
                "--tls-cert (FORKYARD_TLS_CERT) is missing: --tls-key (FORKYARD_TLS_KEY) is set without a certificate".into(),
            ),
            (Some(cert), Some(key)) => {
                let cert = read("--tls-cert (FORKYARD_TLS_CERT)", cert)?;
                let key = read("--tls-key (FORKYARD_TLS_KEY)", key)?;
                let ca = self
                    .ca
                    .as_deref()
                    .map(|p| read("--tls-ca (FORKYARD_TLS_CA)", p))
                    .transpose()?;
                let tls = MeshTls {
                    cert,
                    key,
                    ca,
                    client_auth,
                };
                // Build both sides once now, so a key that does not parse fails start-up.
                tonic::transport::Server::builder()
                    .tls_config(tls.server_config())
                    .map_err(|e| {
                        format!("FORKYARD_TLS_CERT / FORKYARD_TLS_KEY / FORKYARD_TLS_CA: {}", chain(&e))
                    })?;
                Ok(Some(tls))
            }
        }
    }

    /// Load and make it this process's mesh TLS (call once, before serving or dialing).
    pub fn install(&self, client_auth: ClientAuth) -> Result<(), String> {
        let tls = self.load(client_auth)?;
        match &tls {
            Some(t) => tracing::info!(mtls = t.ca.is_some(), "mesh tls on"),
            None => tracing::info!("mesh tls off: plain grpc"),
        }
        MESH_TLS
            .set(tls)
            .map_err(|_| "mesh tls installed twice".to_owned())
    }
}

fn chain(e: &dyn std::error::Error) -> String {
    let mut msg = e.to_string();
    let mut src = e.source();
    while let Some(s) = src {
        msg.push_str(&format!(": {s}"));
        src = s.source();
    }
    msg
}

impl MeshTls {
    fn identity(&self) -> Identity {
        Identity::from_pem(&self.cert, &self.key)
    }

    pub fn server_config(&self) -> ServerTlsConfig {
        let mut cfg = ServerTlsConfig::new().identity(self.identity());
        if let Some(ca) = &self.ca {
            cfg = cfg
                .client_ca_root(Certificate::from_pem(ca))
                .client_auth_optional(self.client_auth == ClientAuth::Optional);
        }
        cfg
    }

    pub fn client_config(&self) -> ClientTlsConfig {
        let mut cfg = ClientTlsConfig::new().identity(self.identity());
        if let Some(ca) = &self.ca {
            cfg = cfg.ca_certificate(Certificate::from_pem(ca));
        }
        cfg
    }
}

impl MeshTls {
    fn rustls_identity(
        &self,
    ) -> Result<
        (
            Vec<rustls::pki_types::CertificateDer<'static>>,
            rustls::pki_types::PrivateKeyDer<'static>,
        ),
        String,
    > {
        use rustls::pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject};
        let certs = CertificateDer::pem_slice_iter(&self.cert)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("mesh certificate: {e}"))?;
        let key = PrivateKeyDer::from_pem_slice(&self.key).map_err(|e| format!("mesh key: {e}"))?;
        Ok((certs, key))
    }

    fn roots(&self) -> Result<Option<rustls::RootCertStore>, String> {
        use rustls::pki_types::{CertificateDer, pem::PemObject};
        let Some(ca) = &self.ca else { return Ok(None) };
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(ca) {
            roots
                .add(cert.map_err(|e| format!("mesh ca: {e}"))?)
                .map_err(|e| format!("mesh ca: {e}"))?;
        }
        Ok(Some(roots))
    }

    fn provider() -> std::sync::Arc<rustls::crypto::CryptoProvider> {
        std::sync::Arc::new(rustls::crypto::ring::default_provider())
    }

    /// A TLS server for a mesh connection that is not gRPC (the LLM gateway's relayed
    /// sandbox traffic): this identity; with a CA, only mesh clients.
    pub fn rustls_server(&self) -> Result<tokio_rustls::TlsAcceptor, String> {
        let (certs, key) = self.rustls_identity()?;
        let builder = rustls::ServerConfig::builder_with_provider(Self::provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?;
        let builder = match self.roots()? {
            Some(roots) => {
                let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                    std::sync::Arc::new(roots),
                    Self::provider(),
                )
                .build()
                .map_err(|e| format!("mesh ca: {e}"))?;
                builder.with_client_cert_verifier(verifier)
            }
            None => builder.with_no_client_auth(),
        };
        let config = builder
            .with_single_cert(certs, key)
            .map_err(|e| format!("mesh certificate: {e}"))?;
        Ok(tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(config)))
    }

    /// A TLS client for the same: this identity, trusting the mesh CA.
    pub fn rustls_client(&self) -> Result<tokio_rustls::TlsConnector, String> {
        let (certs, key) = self.rustls_identity()?;
        let roots = self
            .roots()?
            .ok_or("mesh tls without a CA (FORKYARD_TLS_CA) cannot verify its peers")?;
        let config = rustls::ClientConfig::builder_with_provider(Self::provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_root_certificates(roots)
            .with_client_auth_cert(certs, key)
            .map_err(|e| format!("mesh certificate: {e}"))?;
        Ok(tokio_rustls::TlsConnector::from(std::sync::Arc::new(
            config,
        )))
    }
}

/// This process's mesh TLS, if on.
pub fn mesh() -> Option<&'static MeshTls> {
    MESH_TLS.get().and_then(Option::as_ref)
}

/// An endpoint for an internal channel to `addr`: TLS with the mesh identity when mesh
/// TLS is on (an `http://` address is dialled as `https://`), plain otherwise; with a
/// connect timeout. Per-call deadlines are the caller's (`Endpoint::timeout` or a
/// request's `set_timeout`): an agent's exec stream may rightly last many minutes.
pub fn endpoint(addr: &str) -> Result<Endpoint, String> {
    let addr = addr.trim();
    let tls = mesh();
    let addr = match (tls, addr.strip_prefix("http://")) {
        (Some(_), Some(rest)) => format!("https://{rest}"),
        _ => addr.to_owned(),
    };
    let mut ep = Endpoint::from_shared(addr.clone())
        .map_err(|e| format!("{addr:?} is not a grpc endpoint: {e}"))?
        .connect_timeout(Duration::from_secs(5));
    if let Some(tls) = tls {
        ep = ep
            .tls_config(tls.client_config())
            .map_err(|e| format!("{addr}: tls: {e}"))?;
    }
    Ok(ep)
}

/// [`endpoint`] for one replica of a name, dialled at `addr` (an IP): with mesh TLS on,
/// its certificate is checked against `name`, the name the operator configured.
pub fn endpoint_named(addr: &str, name: &str) -> Result<Endpoint, String> {
    let ep = endpoint(addr)?;
    match mesh() {
        Some(tls) => ep
            .tls_config(tls.client_config().domain_name(name))
            .map_err(|e| format!("{addr}: tls: {e}")),
        None => Ok(ep),
    }
}

/// Deadline of each call on a channel from [`short_call_endpoint`].
pub const SHORT_CALL_DEADLINE: Duration = Duration::from_secs(60);

/// [`endpoint`] for services whose calls are all short request/response (the ledger,
/// the janitor's list/destroy): each call fails with DEADLINE_EXCEEDED after
/// [`SHORT_CALL_DEADLINE`] rather than waiting on a stuck peer. Not for exec streams.
pub fn short_call_endpoint(addr: &str) -> Result<Endpoint, String> {
    Ok(endpoint(addr)?.timeout(SHORT_CALL_DEADLINE))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cert_without_key_names_the_setting() {
        let args = TlsArgs {
            cert: Some("/nonexistent/cert.pem".into()),
            ..Default::default()
        };
        let err = args.load(ClientAuth::Required).unwrap_err();
        assert!(err.contains("FORKYARD_TLS_KEY"), "{err}");
        let args = TlsArgs {
            ca: Some("/nonexistent/ca.pem".into()),
            ..Default::default()
        };
        let err = args.load(ClientAuth::Required).unwrap_err();
        assert!(err.contains("FORKYARD_TLS_CERT"), "{err}");
    }

    #[test]
    fn unreadable_or_non_pem_files_are_refused() {
        let dir = tempfile_dir();
        let junk = dir.join("junk.pem");
        std::fs::write(&junk, b"not pem").unwrap();
        let args = TlsArgs {
            cert: Some(junk.clone()),
            key: Some(dir.join("missing.pem")),
            ca: None,
        };
        let err = args.load(ClientAuth::Required).unwrap_err();
        assert!(err.contains("FORKYARD_TLS_CERT"), "{err}");
    }

    #[test]
    fn flags_coexist_with_the_temporal_tls_flags() {
        use clap::CommandFactory;
        #[derive(clap::Parser)]
        struct Both {
            #[command(flatten)]
            temporal: crate::TemporalArgs,
            #[command(flatten)]
            tls: TlsArgs,
        }
        Both::command().debug_assert();
    }

    #[test]
    fn off_by_default() {
        assert!(
            TlsArgs::default()
                .load(ClientAuth::Required)
                .unwrap()
                .is_none()
        );
    }

    fn tempfile_dir() -> PathBuf {
        let d = std::env::temp_dir().join(format!("forkyard-tls-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d
    }
}
