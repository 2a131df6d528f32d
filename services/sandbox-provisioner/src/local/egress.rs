//! The egress allowlist proxy: one per sandbox that may reach the network, listening on
//! a Unix socket in the sandbox's directory (bind-mounted into the sandbox, where the
//! forwarder exposes it on 127.0.0.1:3128). It speaks HTTP proxy: `CONNECT host:port`
//! (HTTPS, any TLS) and absolute-form `GET http://host/...` requests. Hosts not on the
//! allowlist get `403`. A name on the list that resolves to a loopback, private or
//! link-local address is refused too (DNS rebinding onto the host's own services); an IP
//! literal on the list is taken as meant.

use forkyard_common::hosts;
use std::{net::IpAddr, path::Path, sync::Arc};
use tokio::{
    io::{AsyncBufReadExt, AsyncWriteExt, BufReader},
    net::{TcpStream, UnixListener, UnixStream},
};
use tokio_util::sync::CancellationToken;

const MAX_HEAD: usize = 16 * 1024;

/// Allowed destinations: `host` (any port), `host:port`, or `*.domain` (any subdomain).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Allowlist(Vec<String>);

impl Allowlist {
    pub fn parse(entries: &[String]) -> Result<Self, String> {
        let mut out = Vec::new();
        for e in entries {
            let e = e.trim().to_ascii_lowercase();
            let ok = !e.is_empty()
                && e.chars()
                    .all(|c| c.is_ascii_alphanumeric() || ".-:*_[]".contains(c))
                && !e[1..].contains('*');
            if !ok {
                return Err(format!("{e:?} is not a host, host:port or *.domain"));
            }
            out.push(e);
        }
        Ok(Self(out))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn entries(&self) -> &[String] {
        &self.0
    }

    /// Entries naming the host itself, the mesh or a private network: loopback,
    /// link-local, private or unspecified IP literals (with the address), and
    /// `localhost` names (without one).
    pub fn private_entries(&self) -> Vec<(String, Option<IpAddr>)> {
        self.0
            .iter()
            .filter_map(|e| {
                let host = hosts::host_part(e);
                if hosts::is_localhost(host) {
                    return Some((e.clone(), None));
                }
                let ip: IpAddr = host.parse().ok()?;
                hosts::internal(ip).then(|| (e.clone(), Some(ip)))
            })
            .collect()
    }

    /// Whether `host:port` may be reached, and whether `host` was listed literally as an IP.
    pub fn allows(&self, host: &str, port: u16) -> bool {
        let host = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_ascii_lowercase();
        self.0.iter().any(|e| {
            let (h, p) = match e.rsplit_once(':') {
                Some((h, p)) if !h.contains(':') || h.ends_with(']') => (h, p.parse().ok()),
                _ => (e.as_str(), None),
            };
            let h = h.trim_start_matches('[').trim_end_matches(']');
            let host_ok = match h.strip_prefix("*.") {
                Some(domain) => host.ends_with(&format!(".{domain}")),
                None => host == h,
            };
            host_ok && p.is_none_or(|p: u16| p == port)
        })
    }
}

/// Serve the proxy on `socket` until `stop` fires.
pub fn spawn(socket: &Path, allow: Allowlist, stop: CancellationToken) -> std::io::Result<()> {
    let _ = std::fs::remove_file(socket);
    let listener = UnixListener::bind(socket)?;
    let allow = Arc::new(allow);
    let socket = socket.to_owned();
    tokio::spawn(async move {
        loop {
            tokio::select! {
                () = stop.cancelled() => break,
                conn = listener.accept() => match conn {
                    Ok((conn, _)) => {
                        let allow = allow.clone();
                        let stop = stop.clone();
                        tokio::spawn(async move {
                            tokio::select! {
                                () = stop.cancelled() => {}
                                _ = serve(conn, &allow) => {}
                            }
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

async fn serve(conn: UnixStream, allow: &Allowlist) -> std::io::Result<()> {
    let mut conn = BufReader::new(conn);
    let Some(head) = read_head(&mut conn).await? else {
        return Ok(());
    };
    let text = String::from_utf8_lossy(&head).into_owned();
    let request_line = text.split("\r\n").next().unwrap_or_default();
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
    let mut upstream = match connect(&host, port).await {
        Ok(s) => s,
        Err(e) => return respond(conn.get_mut(), 502, &e).await,
    };
    match rest {
        None => {
            conn.get_mut()
                .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
                .await?;
        }
        Some(line) => {
            // Origin-form request line, the original headers, then whatever follows.
            let headers = &text[request_line.len() + 2..];
            upstream.write_all(line.as_bytes()).await?;
            upstream.write_all(headers.as_bytes()).await?;
        }
    }
    let buffered = conn.buffer().to_vec();
    upstream.write_all(&buffered).await?;
    let mut conn = conn.into_inner();
    tokio::io::copy_bidirectional(&mut conn, &mut upstream).await?;
    Ok(())
}

/// The request's head, up to its blank line; `None` when the client closed first or
/// sent more than [`MAX_HEAD`].
async fn read_head(conn: &mut BufReader<UnixStream>) -> std::io::Result<Option<Vec<u8>>> {
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

/// Connect to an allowed host. Names must not resolve to the host's own or private
/// networks; IP literals were listed explicitly and are used as given.
async fn connect(host: &str, port: u16) -> Result<TcpStream, String> {
    if let Ok(ip) = host.parse::<IpAddr>() {
        return TcpStream::connect((ip, port))
            .await
            .map_err(|e| e.to_string());
    }
    let addrs: Vec<_> = tokio::net::lookup_host((host, port))
        .await
        .map_err(|e| format!("cannot resolve {host}: {e}"))?
        .collect();
    if addrs.iter().any(|a| hosts::internal(a.ip())) {
        return Err(format!("{host} resolves to an internal address"));
    }
    TcpStream::connect(&addrs[..])
        .await
        .map_err(|e| e.to_string())
}

async fn respond(conn: &mut UnixStream, code: u16, msg: &str) -> std::io::Result<()> {
    let reason = match code {
        400 => "Bad Request",
        403 => "Forbidden",
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
mod tests {
    use super::*;

    #[test]
    fn allowlist_matching() {
        let a = Allowlist::parse(&[
            "example.com".into(),
            "*.github.com".into(),
            "127.0.0.1:8080".into(),
        ])
        .unwrap();
        assert!(a.allows("example.com", 443));
        assert!(a.allows("EXAMPLE.com", 80));
        assert!(!a.allows("evil-example.com", 443));
        assert!(a.allows("api.github.com", 443));
        assert!(!a.allows("github.com", 443));
        assert!(a.allows("127.0.0.1", 8080));
        assert!(!a.allows("127.0.0.1", 8081));
        assert!(Allowlist::parse(&["a b".into()]).is_err());
        assert!(Allowlist::parse(&["a.*.com".into()]).is_err());
        assert!(
            hosts::internal("10.1.2.3".parse().unwrap())
                && !hosts::internal("1.1.1.1".parse().unwrap())
        );
    }
}
