//! The egress allowlist proxy: one per sandbox that may reach the network, listening on
//! a Unix socket in the sandbox's directory (bind-mounted into the sandbox, where the
//! forwarder exposes it on 127.0.0.1:3128). It speaks HTTP proxy: `CONNECT host:port`
//! (HTTPS, any TLS) and absolute-form `GET http://host/...` requests. Hosts not on the
//! allowlist get `403`. A name on the list that resolves to a loopback, private or
//! link-local address is refused too (DNS rebinding onto the host's own services); an IP
//! literal on the list is taken as meant.

#[path = "egress_http.rs"]
mod http;

use forkyard_common::{
    allowed_hosts, hosts,
    http_limits::{Idle, Limits, Slots},
};
use std::{net::IpAddr, path::Path, sync::Arc, time::Duration};
use tokio::{
    io::{AsyncBufReadExt, AsyncWriteExt, BufReader},
    net::{TcpStream, UnixListener, UnixStream},
};
use tokio_util::sync::CancellationToken;

const MAX_HEAD: usize = 16 * 1024;

/// The sandbox's side of a connection through the proxy.
type Conn = Idle<UnixStream>;

/// 256 connections at once; 30 s for a request's head (and for the connection upstream);
/// 15 minutes with no byte moving (a long download that stalls, a tunnel left open).
pub const DEFAULT_LIMITS: Limits = Limits {
    max_connections: 256,
    header_timeout: Duration::from_secs(30),
    idle_timeout: Duration::from_secs(900),
};

/// Allowed destinations: `host` (any port), `host:port`, or `*.domain` (any subdomain),
/// as the request gave them (lowercased) and as parsed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Allowlist(Vec<(String, Entry)>);

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Normalised (`allowed_hosts::normal_host`); for `*.domain`, the domain.
    host: String,
    wildcard: bool,
    port: Option<u16>,
}

impl Allowlist {
    /// The entries, or why one cannot be one: `*` alone (every host is not an egress
    /// allowlist), a port outside 1 to 65535, a host longer than DNS allows.
    pub fn parse(entries: &[String]) -> Result<Self, String> {
        let mut out = Vec::new();
        for e in entries {
            let e = e.trim().to_ascii_lowercase();
            let entry = Self::entry(&e)
                .ok_or_else(|| format!("{e:?} is not a host, host:port or *.domain"))?;
            out.push((e, entry));
        }
        Ok(Self(out))
    }

    fn entry(e: &str) -> Option<Entry> {
        if e.len() > allowed_hosts::MAX_HOST_LEN + ":65535".len() {
            return None;
        }
        let (host, port) = allowed_hosts::split_host_port(e).ok()?;
        let (host, wildcard) = match host.strip_prefix("*.") {
            Some(domain) => (domain, true),
            None => (host, false),
        };
        let host = allowed_hosts::normal_host(host);
        let ok = allowed_hosts::valid_host(&host) && !(wildcard && host.parse::<IpAddr>().is_ok());
        ok.then_some(Entry {
            host,
            wildcard,
            port,
        })
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Entries naming the host itself, the mesh or a private network: loopback,
    /// link-local, private or unspecified IP literals (with the address), and
    /// `localhost` names (without one).
    pub fn private_entries(&self) -> Vec<(String, Option<IpAddr>)> {
        self.0
            .iter()
            .filter_map(|(e, entry)| {
                if hosts::is_localhost(&entry.host) {
                    return Some((e.clone(), None));
                }
                let ip: IpAddr = entry.host.parse().ok()?;
                hosts::internal(ip).then(|| (e.clone(), Some(ip)))
            })
            .collect()
    }

    /// Whether `host:port` may be reached.
    pub fn allows(&self, host: &str, port: u16) -> bool {
        let host = allowed_hosts::normal_host(host);
        self.0.iter().any(|(_, e)| {
            let host_ok = if e.wildcard {
                host.strip_suffix(e.host.as_str())
                    .is_some_and(|sub| sub.len() > 1 && sub.ends_with('.'))
            } else {
                host == e.host
            };
            host_ok && e.port.is_none_or(|p| p == port)
        })
    }
}

/// Serve the proxy on `socket` until `stop` fires, holding at most `max_connections`
/// at once: each is two of the provisioner's descriptors (the sandbox's and the
/// upstream's), so past them the sandbox's new connections wait in the socket's backlog
/// rather than take the descriptors the provisioner's gRPC port needs.
pub fn spawn(
    socket: &Path,
    allow: Allowlist,
    limits: Limits,
    stop: CancellationToken,
) -> std::io::Result<()> {
    let _ = std::fs::remove_file(socket);
    let listener = UnixListener::bind(socket)?;
    let allow = Arc::new(allow);
    let socket = socket.to_owned();
    let slots = Slots::new(limits.max_connections);
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
                        let allow = allow.clone();
                        let stop = stop.clone();
                        tokio::spawn(async move {
                            tokio::select! {
                                () = stop.cancelled() => {}
                                _ = serve(conn, &allow, limits) => {}
                            }
                            drop(slot);
                        });
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "egress proxy accept failed");
                        break;
                    }
                },
            }
        }
        let _ = std::fs::remove_file(&socket);
    });
    Ok(())
}

/// One connection: its head read within the header timeout, then relayed until either
/// side closes or no byte has moved for the idle timeout (a sandbox cannot hold the
/// provisioner's descriptors with connections that say nothing).
async fn serve(conn: UnixStream, allow: &Allowlist, limits: Limits) -> std::io::Result<()> {
    let mut conn = BufReader::new(Idle::new(conn, limits.idle_timeout));
    let Ok(head) = tokio::time::timeout(limits.header_timeout, read_head(&mut conn)).await else {
        return respond(conn.get_mut(), 408, "no request head in time").await;
    };
    let Some(head) = head? else {
        return Ok(());
    };
    let text = String::from_utf8_lossy(&head).into_owned();
    let request_line = text
        .lines()
        .next()
        .unwrap_or_default()
        .trim_end_matches('\r');
    let (host, port, rest) = match destination(request_line) {
        Ok(d) => d,
        Err(why) => return respond(conn.get_mut(), 400, why).await,
    };
    if !allow.allows(&host, port) {
        tracing::info!(%host, port, "egress refused: not on the allowlist");
        return respond(
            conn.get_mut(),
            403,
            "host not on the sandbox's egress allowlist",
        )
        .await;
    }
    // A plain-HTTP request goes out as one request to the checked host (`http`).
    let plain = match rest.map(|line| http::upstream_head(&text, &host, port, &line)) {
        None => None,
        Some(Ok(head)) => Some(head),
        Some(Err((code, why))) => return respond(conn.get_mut(), code, why).await,
    };
    let connected = tokio::time::timeout(limits.header_timeout, connect(&host, port)).await;
    let upstream = match connected {
        Ok(Ok(s)) => s,
        Ok(Err((code, why))) => return respond(conn.get_mut(), code, &why).await,
        Err(_) => {
            return respond(
                conn.get_mut(),
                504,
                &format!("{host}:{port}: no connection in time"),
            )
            .await;
        }
    };
    // Both sides bounded: a plain request's answer is read from upstream alone, once its
    // body is sent.
    let mut upstream = Idle::new(upstream, limits.idle_timeout);
    let buffered = conn.buffer().to_vec();
    let mut conn = conn.into_inner();
    if let Some((head, length)) = plain {
        return http::forward(conn, &buffered, upstream, &head, length).await;
    }
    conn.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
        .await?;
    upstream.write_all(&buffered).await?;
    tokio::io::copy_bidirectional(&mut conn, &mut upstream).await?;
    Ok(())
}

/// The request's head, up to its blank line; `None` when the client closed first or
/// sent more than [`MAX_HEAD`].
async fn read_head(conn: &mut BufReader<Conn>) -> std::io::Result<Option<Vec<u8>>> {
    let mut head = Vec::new();
    loop {
        let n = conn.read_until(b'\n', &mut head).await?;
        if n == 0 || head.len() > MAX_HEAD {
            return Ok(None);
        }
        if head.ends_with(b"\r\n\r\n") || head.ends_with(b"\n\n") {
            return Ok(Some(head));
        }
    }
}

/// Where a request line goes: host, port, and for a plain HTTP request the origin-form
/// request line to send upstream instead (`None` for a CONNECT tunnel).
fn destination(request_line: &str) -> Result<(String, u16, Option<String>), &'static str> {
    let mut parts = request_line.split_whitespace();
    let (method, target, version) = (
        parts.next().unwrap_or_default(),
        parts.next().unwrap_or_default(),
        parts.next().unwrap_or("HTTP/1.1"),
    );
    if method.eq_ignore_ascii_case("CONNECT") {
        let (h, p) = split_host_port(target, 443).ok_or("bad CONNECT target")?;
        return Ok((h, p, None));
    }
    let after = target
        .strip_prefix("http://")
        .ok_or("only absolute http:// URLs and CONNECT")?;
    let (authority, path) = after.split_at(after.find('/').unwrap_or(after.len()));
    let path = if path.is_empty() { "/" } else { path };
    let (h, p) = split_host_port(authority, 80).ok_or("bad URL")?;
    Ok((h, p, Some(format!("{method} {path} {version}\r\n"))))
}

fn split_host_port(authority: &str, default: u16) -> Option<(String, u16)> {
    if authority.is_empty() || authority.contains('@') {
        return None;
    }
    if let Some(v6) = authority.strip_prefix('[') {
        let (h, rest) = v6.split_once(']')?;
        let port = match rest.strip_prefix(':') {
            Some(p) => p.parse().ok()?,
            None => default,
        };
        return Some((h.to_owned(), port));
    }
    match authority.rsplit_once(':') {
        Some((h, p)) => Some((h.to_owned(), p.parse().ok()?)),
        None => Some((authority.to_owned(), default)),
    }
}

/// Connect to an allowed host, or the status and reason to answer with. Names must not
/// resolve to an address that is not public (the host's own services, the mesh's, a
/// metadata service: DNS rebinding onto them), and the connection goes to the addresses
/// checked; IP literals were listed explicitly and are used as given.
async fn connect(host: &str, port: u16) -> Result<TcpStream, (u16, String)> {
    let unreachable = |e: std::io::Error| (502, e.to_string());
    if let Ok(ip) = host.parse::<IpAddr>() {
        return TcpStream::connect((ip, port)).await.map_err(unreachable);
    }
    let addrs: Vec<_> = tokio::net::lookup_host((host, port))
        .await
        .map_err(|e| (502, format!("cannot resolve {host}: {e}")))?
        .collect();
    all_public(host, &addrs)?;
    TcpStream::connect(&addrs[..]).await.map_err(unreachable)
}

/// A name's addresses, refused (403) when any of them is not a public one: one internal
/// address among public ones is how DNS rebinding gets in.
fn all_public(host: &str, addrs: &[std::net::SocketAddr]) -> Result<(), (u16, String)> {
    match addrs
        .iter()
        .find_map(|a| Some((a.ip(), hosts::special_block(a.ip())?)))
    {
        None => Ok(()),
        Some((addr, block)) => {
            tracing::info!(%host, %addr, block, "egress refused: the name resolves to an internal address");
            Err((403, format!("{host} resolves to an internal address")))
        }
    }
}

async fn respond(conn: &mut Conn, code: u16, msg: &str) -> std::io::Result<()> {
    let reason = match code {
        400 => "Bad Request",
        403 => "Forbidden",
        408 => "Request Timeout",
        411 => "Length Required",
        504 => "Gateway Timeout",
        _ => "Bad Gateway",
    };
    let body = format!("{msg}\n");
    let resp = format!(
        "HTTP/1.1 {code} {reason}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    conn.write_all(resp.as_bytes()).await?;
    conn.shutdown().await
}

#[cfg(test)]
#[path = "egress_tests.rs"]
mod tests;
