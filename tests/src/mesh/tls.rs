//! A mesh with mutual TLS: its CA and certificates (`scripts/certs.sh`), and channels
//! that present one service's certificate, or none.

use super::Mesh;
use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};
use tonic::transport::Channel;

impl Mesh {
    /// Where `scripts/certs.sh` put the mesh's CA and certificates (TLS meshes).
    pub fn certs_dir(&self) -> PathBuf {
        self.state.path().join("certs")
    }

    pub(super) fn make_certs(&self) -> anyhow::Result<()> {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/certs.sh");
        let out = Command::new("bash")
            .arg(&script)
            .arg(self.certs_dir())
            .output()?;
        anyhow::ensure!(
            out.status.success(),
            "{} failed: {}",
            script.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(())
    }

    /// A TLS channel to `service` that trusts the mesh CA and presents `identity`'s
    /// certificate from the certs dir (`None`: no client certificate).
    pub async fn tls_channel(
        &self,
        service: &str,
        identity: Option<&str>,
    ) -> anyhow::Result<Channel> {
        use tonic::transport::{Certificate, ClientTlsConfig, Identity};
        let certs = self.certs_dir();
        let mut tls = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(std::fs::read(certs.join("ca.pem"))?));
        if let Some(id) = identity {
            tls = tls.identity(Identity::from_pem(
                std::fs::read(certs.join(format!("{id}.pem")))?,
                std::fs::read(certs.join(format!("{id}.key")))?,
            ));
        }
        Ok(tonic::transport::Endpoint::from_shared(format!(
            "https://127.0.0.1:{}",
            self.port(service)
        ))?
        .tls_config(tls)?
        .connect_timeout(Duration::from_secs(2))
        .connect()
        .await?)
    }
}
