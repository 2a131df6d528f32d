//! The sandbox's way to the LLM gateway, for one command: a Unix socket in the sandbox's
//! directory (bind-mounted into the sandbox, where the forwarder exposes it on
//! [`forkyard_proto::SANDBOX_LLM_ADDR`]) whose every connection is relayed byte for byte
//! to the gateway named by the command's `ExecRequest.llm_gateway`, after a PROXY v2
//! header naming the sandbox. The relay reads nothing of the stream (no buffering, no
//! parsing): the gateway checks the fork's token against the announced sandbox.
//! Only that one gateway is reachable, and only while the command runs.
//!
//! A sandbox run by its init has one relay for its whole life (its socket is bound once,
//! when its bubblewrap starts): it relays to the gateway of the sandbox's running LLM
//! commands ([`LlmSlot`]), and closes every connection while none runs.
//!
//! Every connection holds two of the provisioner's descriptors (the sandbox's and the
//! gateway's), so a relay holds at most [`RelayLimits::max_connections`] at once
//! (accepting none past them: the sandbox's connections wait in the socket's backlog)
//! and closes one on which no byte has moved for its idle timeout: a sandbox opening
//! connections by the thousand takes neither the provisioner's descriptors nor its
//! gRPC port's.

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

/// What one relay's connections are held to (`--llm-relay-*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RelayLimits {
    /// Connections relayed at once.
    pub max_connections: usize,
    /// How long a relayed connection may move no byte either way (above the gateway's
    /// own, which outlasts a model's silence before its answer).
    pub idle_timeout: std::time::Duration,
}

impl RelayLimits {
    /// 64 connections (an agent CLI opens a handful), 15 minutes.
    pub const DEFAULT: Self = Self {
        max_connections: 64,
        idle_timeout: std::time::Duration::from_secs(900),
    };
}

/// `--llm-relay-*`: the bounds on each sandbox's LLM relay.
#[derive(Debug, Clone, clap::Args)]
pub struct RelayLimitsArgs {
    /// Connections one sandbox's LLM relay holds at once (each two of the provisioner's
    /// descriptors); past them the sandbox's new connections wait.
    #[arg(long, env = "FORKYARD_LLM_RELAY_MAX_CONNECTIONS", default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..))]
    pub llm_relay_max_connections: u32,
    /// How long a relayed connection may move no byte either way before it is closed.
    #[arg(long, env = "FORKYARD_LLM_RELAY_IDLE_TIMEOUT_SECS", default_value_t = 900, value_parser = clap::value_parser!(u64).range(1..))]
    pub llm_relay_idle_timeout_secs: u64,
}

impl RelayLimitsArgs {
    pub fn limits(&self) -> RelayLimits {
        RelayLimits {
            max_connections: usize::try_from(self.llm_relay_max_connections).unwrap_or(usize::MAX),
            idle_timeout: std::time::Duration::from_secs(self.llm_relay_idle_timeout_secs),
        }
    }
}

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
    socket: BoundSocket,
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stop.cancel();
        self.socket.remove();
    }
}

/// A socket file this relay bound: removed only while it is still that file, so a
/// relay stopping late never removes the socket a newer relay bound at the same path.
#[derive(Clone)]
struct BoundSocket {
    path: PathBuf,
    inode: (u64, u64),
}

impl BoundSocket {
    fn new(path: &Path) -> std::io::Result<Self> {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::symlink_metadata(path)?;
        Ok(Self {
            path: path.to_owned(),
            inode: (m.dev(), m.ino()),
        })
    }

    fn remove(&self) {
        use std::os::unix::fs::MetadataExt;
        if std::fs::symlink_metadata(&self.path).is_ok_and(|m| (m.dev(), m.ino()) == self.inode) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Where a relay's connections go: the gateway (`host:port`) at the moment a connection
/// arrives; `None` closes it.
pub type Gateway = Arc<dyn Fn() -> Option<String> + Send + Sync>;

/// The gateway of a sandbox's running LLM commands: commands running at once must name
/// the same one (each holds an [`LlmLease`]); when the last ends, none is reachable.
#[derive(Default)]
pub struct LlmSlot(std::sync::Mutex<Option<(String, usize)>>);

/// One command's hold on its sandbox's [`LlmSlot`].
pub struct LlmLease(Arc<LlmSlot>);

impl LlmSlot {
    fn lock(&self) -> std::sync::MutexGuard<'_, Option<(String, usize)>> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub fn current(&self) -> Option<String> {
        self.lock().as_ref().map(|(g, _)| g.clone())
    }

    /// Hold the slot for `gateway`; refused while other commands hold it for another.
    pub fn lease(self: &Arc<Self>, gateway: String, sandbox_id: &str) -> Result<LlmLease> {
        let mut slot = self.lock();
        match slot.as_mut() {
            Some((held, users)) if *held == gateway => *users += 1,
            Some((held, _)) => {
                return Err(ProvisionerError::FailedPrecondition(format!(
                    "sandbox {sandbox_id} has a command running with llm gateway {held}; one with {gateway} cannot run beside it"
                )));
            }
            None => *slot = Some((gateway, 1)),
        }
        Ok(LlmLease(self.clone()))
    }
}

impl Drop for LlmLease {
    fn drop(&mut self) {
        let mut slot = self.0.lock();
        if let Some((_, users)) = slot.as_mut() {
            *users -= 1;
            if *users == 0 {
                *slot = None;
            }
        }
    }
}

/// Serve `socket` until the returned [`Relay`] is dropped or `stop` fires (the sandbox is
/// destroyed), relaying to `gateway` for `sandbox_id` within `limits`.
pub fn spawn(
    socket: &Path,
    gateway: Gateway,
    sandbox_id: &str,
    limits: RelayLimits,
    stop: CancellationToken,
) -> std::io::Result<Relay> {
    let _ = std::fs::remove_file(socket);
    let listener = UnixListener::bind(socket)?;
    let bound = BoundSocket::new(socket)?;
    let relay = Relay {
        stop: stop.clone(),
        socket: bound.clone(),
    };
    let header: Arc<[u8]> = forkyard_common::proxy_header::encode(sandbox_id).into();
    let sandbox_id = sandbox_id.to_owned();
    let slots = forkyard_common::http_limits::Slots::new(limits.max_connections);
    tokio::spawn(async move {
        loop {
            let slot = tokio::select! {
                () = stop.cancelled() => break,
                slot = slots.take() => slot,
            };
            tokio::select! {
                () = stop.cancelled() => break,
                conn = listener.accept() => match conn {
                    Ok((conn, _)) => {
                        let conn = forkyard_common::http_limits::Idle::new(conn, limits.idle_timeout);
                        let Some(gateway) = gateway() else {
                            drop(conn);
                            continue;
                        };
                        let (header, stop) = (header.clone(), stop.clone());
                        let sandbox_id = sandbox_id.clone();
                        tokio::spawn(async move {
                            tokio::select! {
                                () = stop.cancelled() => {}
                                r = relay_one(conn, &gateway, &header) => if let Err(e) = r {
                                    tracing::debug!(sandbox_id = %sandbox_id, gateway = %gateway, error = %e, "llm relay connection ended");
                                },
                            }
                            drop(slot);
                        });
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "llm relay accept failed");
                        break;
                    }
                },
            }
        }
        bound.remove();
    });
    Ok(relay)
}

/// One connection of the sandbox's relayed byte for byte to `gateway`, after `header`
/// (which names the sandbox to the gateway).
async fn relay_one<C>(mut conn: C, gateway: &str, header: &[u8]) -> std::io::Result<(u64, u64)>
where
    C: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let up = TcpStream::connect(gateway).await?;
    up.set_nodelay(true)?;
    match forkyard_common::tls::mesh() {
        // Mesh TLS: the gateway takes mesh clients only.
        Some(tls) => {
            let connector = mesh_connector(tls)?;
            let host = gateway.rsplit_once(':').map_or(gateway, |(h, _)| h);
            let name = rustls_name(host)?;
            let mut up = connector.connect(name, up).await?;
            up.write_all(header).await?;
            tokio::io::copy_bidirectional(&mut conn, &mut up).await
        }
        None => {
            let mut up = up;
            up.write_all(header).await?;
            tokio::io::copy_bidirectional(&mut conn, &mut up).await
        }
    }
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
