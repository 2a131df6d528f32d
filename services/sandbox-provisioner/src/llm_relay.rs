//! The sandbox's way to the LLM gateway, for one command: a Unix socket in the sandbox's
//! directory (bind-mounted into the sandbox, where the forwarder exposes it on
//! [`forkyard_proto::SANDBOX_LLM_ADDR`]) whose every connection is relayed byte for byte
//! to the gateway named by the command's `ExecRequest.llm_gateway`, after a PROXY v2
//! header naming the sandbox. The relay reads nothing of the stream (no buffering, no
//! parsing): the gateway checks the fork's token against the announced sandbox.
//! Only that one gateway is reachable, and only while the command runs.

use crate::error::{ProvisionerError, Result};
use std::{
    path::{Path, PathBuf},
    sync::Arc,
};
use tokio::{
    io::AsyncWriteExt,
    net::{TcpStream, UnixListener},
};
use tokio_util::sync::CancellationToken;

/// `host:port` of an `http://host:port` gateway URL.
pub fn authority(url: &str) -> Result<String> {
    let bad = |why: &str| ProvisionerError::invalid("llm_gateway", format!("{url:?} {why}"));
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| bad("must be an http://host:port URL"))?;
    let authority = rest.split('/').next().unwrap_or_default();
    let (host, port) = authority
        .rsplit_once(':')
        .ok_or_else(|| bad("must name a port"))?;
    if host.is_empty() || port.parse::<u16>().is_err() || authority.contains('@') {
        return Err(bad("must be an http://host:port URL"));
    }
    Ok(authority.to_owned())
}

/// A running relay: dropping it (the command is done with) stops it and removes its
/// socket at once, so no later command of the sandbox can reach the gateway through it.
pub struct Relay {
    stop: CancellationToken,
    socket: PathBuf,
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stop.cancel();
        let _ = std::fs::remove_file(&self.socket);
    }
}

/// Serve `socket` until the returned [`Relay`] is dropped or `stop` fires (the sandbox is
/// destroyed), relaying to `gateway` (`host:port`) for `sandbox_id`.
pub fn spawn(
    socket: &Path,
    gateway: String,
    sandbox_id: &str,
    stop: CancellationToken,
) -> std::io::Result<Relay> {
    let _ = std::fs::remove_file(socket);
    let listener = UnixListener::bind(socket)?;
    let relay = Relay {
        stop: stop.clone(),
        socket: socket.to_owned(),
    };
    let header: Arc<[u8]> = forkyard_common::proxy_header::encode(sandbox_id).into();
    let socket = socket.to_owned();
    let sandbox_id = sandbox_id.to_owned();
    tokio::spawn(async move {
        loop {
            tokio::select! {
                () = stop.cancelled() => break,
                conn = listener.accept() => match conn {
                    Ok((mut conn, _)) => {
                        let (gateway, header, stop) = (gateway.clone(), header.clone(), stop.clone());
                        let sandbox_id = sandbox_id.clone();
                        tokio::spawn(async move {
                            let relay = async {
                                let up = TcpStream::connect(&gateway).await?;
                                up.set_nodelay(true)?;
                                match forkyard_common::tls::mesh() {
                                    // Mesh TLS: the gateway takes mesh clients only.
                                    Some(tls) => {
                                        let connector = mesh_connector(tls)?;
                                        let host = gateway.rsplit_once(':').map_or(gateway.as_str(), |(h, _)| h);
                                        let name = rustls_name(host)?;
                                        let mut up = connector.connect(name, up).await?;
                                        up.write_all(&header).await?;
                                        tokio::io::copy_bidirectional(&mut conn, &mut up).await
                                    }
                                    None => {
                                        let mut up = up;
                                        up.write_all(&header).await?;
                                        tokio::io::copy_bidirectional(&mut conn, &mut up).await
                                    }
                                }
                            };
                            tokio::select! {
                                () = stop.cancelled() => {}
                                r = relay => if let Err(e) = r {
                                    tracing::debug!(sandbox_id = %sandbox_id, gateway = %gateway, error = %e, "llm relay connection ended");
                                },
                            }
                        });
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "llm relay accept failed");
                        break;
                    }
                },
            }
        }
        let _ = std::fs::remove_file(&socket);
    });
    Ok(relay)
}

/// The mesh TLS client, built once.
fn mesh_connector(
    tls: &forkyard_common::tls::MeshTls,
) -> std::io::Result<forkyard_common::tls::tokio_rustls::TlsConnector> {
    static CONNECTOR: std::sync::OnceLock<
        Result<forkyard_common::tls::tokio_rustls::TlsConnector, String>,
    > = std::sync::OnceLock::new();
    CONNECTOR
        .get_or_init(|| tls.rustls_client())
        .clone()
        .map_err(std::io::Error::other)
}

/// The name a gateway's certificate must carry: its host (a DNS name or an IP).
fn rustls_name(
    host: &str,
) -> std::io::Result<forkyard_common::tls::tokio_rustls::rustls::pki_types::ServerName<'static>> {
    let host = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned();
    forkyard_common::tls::tokio_rustls::rustls::pki_types::ServerName::try_from(host)
        .map_err(|e| std::io::Error::other(format!("llm gateway host: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_host_port_urls() {
        assert_eq!(
            authority("http://127.0.0.1:50056").unwrap(),
            "127.0.0.1:50056"
        );
        assert_eq!(
            authority("http://runner-0.runner:50056/").unwrap(),
            "runner-0.runner:50056"
        );
        for bad in [
            "127.0.0.1:1",
            "http://host",
            "http://u@h:1",
            "https://h:1",
            "http://:1",
        ] {
            assert!(authority(bad).is_err(), "{bad}");
        }
    }
}
