//! A plain-HTTP request through the egress proxy, held to the host that was checked: the
//! request's own `Host` header would pick another site on the same address (a CDN's or a
//! shared host's), and a second request pipelined on the connection would go out
//! unchecked. So one request is forwarded, with `Host` the checked authority and
//! `Connection: close`, its body by its `Content-Length`; the answer goes back and the
//! connection ends.

use forkyard_common::http_limits::Idle;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpStream, UnixStream},
};

/// Headers that are the connection's (hop-by-hop) or the proxy's, or that would say
/// where the request goes: not forwarded.
const DROPPED: &[&str] = &[
    "host",
    "connection",
    "proxy-connection",
    "keep-alive",
    "proxy-authorization",
    "te",
    "trailer",
    "upgrade",
];

/// The head to send upstream for `head` (the client's, request line first), to the
/// checked `host:port`, and the length of the body that follows it; `Err` is the status
/// and reason to answer the client with.
pub(super) fn upstream_head(
    head: &str,
    host: &str,
    port: u16,
    request_line: &str,
) -> Result<(String, u64), (u16, &'static str)> {
    let mut out = String::from(request_line);
    let authority = match (host.contains(':'), port) {
        (true, 80) => format!("[{host}]"),
        (true, p) => format!("[{host}]:{p}"),
        (false, 80) => host.to_owned(),
        (false, p) => format!("{host}:{p}"),
    };
    out.push_str(&format!("Host: {authority}\r\nConnection: close\r\n"));
    let mut length: Option<u64> = None;
    for line in head.lines().skip(1).map(|l| l.trim_end_matches('\r')) {
        if line.is_empty() {
            break;
        }
        if line.starts_with([' ', '\t']) {
            return Err((400, "folded header lines are not forwarded"));
        }
        let (name, value) = line.split_once(':').ok_or((400, "bad header line"))?;
        let token = |c: char| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c);
        if name.is_empty() || !name.chars().all(token) {
            return Err((400, "bad header name"));
        }
        let lower = name.to_ascii_lowercase();
        if lower == "transfer-encoding" {
            return Err((
                411,
                "plain-http request bodies need a content-length (or use https)",
            ));
        }
        if lower == "content-length" {
            let n: u64 = value
                .trim()
                .parse()
                .map_err(|_| (400, "bad content-length"))?;
            if length.is_some_and(|l| l != n) {
                return Err((400, "conflicting content-length headers"));
            }
            length = Some(n);
        }
        if !DROPPED.contains(&lower.as_str()) {
            out.push_str(line);
            out.push_str("\r\n");
        }
    }
    out.push_str("\r\n");
    Ok((out, length.unwrap_or(0)))
}

/// Send `head` and the body's `length` bytes (the first of them in `buffered`, read with
/// the client's head) upstream, and the answer back, both ways at once (a client that
/// waits for `100 Continue` gets it); whatever the client sends after its body is not
/// forwarded.
pub(super) async fn forward(
    client: Idle<UnixStream>,
    buffered: &[u8],
    mut upstream: Idle<TcpStream>,
    head: &str,
    length: u64,
) -> std::io::Result<()> {
    upstream.write_all(head.as_bytes()).await?;
    let (client_rd, mut client_wr) = tokio::io::split(client);
    let (mut up_rd, mut up_wr) = tokio::io::split(upstream);
    let mut body = buffered.chain(client_rd).take(length);
    let send = async {
        tokio::io::copy(&mut body, &mut up_wr).await?;
        up_wr.flush().await
    };
    let answer = async {
        tokio::io::copy(&mut up_rd, &mut client_wr).await?;
        client_wr.shutdown().await
    };
    let (sent, answered) = tokio::join!(send, answer);
    sent.and(answered)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_request_goes_to_the_checked_host_once() {
        let head = "GET http://a.example/x HTTP/1.1\r\nHost: other.example\r\nUser-Agent: t\r\nConnection: keep-alive, X-Secret\r\nProxy-Authorization: Basic eA==\r\nContent-Length: 3\r\n\r\n";
        let (out, len) = upstream_head(head, "a.example", 8080, "GET /x HTTP/1.1\r\n").unwrap();
        assert_eq!(
            out,
            "GET /x HTTP/1.1\r\nHost: a.example:8080\r\nConnection: close\r\nUser-Agent: t\r\nContent-Length: 3\r\n\r\n"
        );
        assert_eq!(len, 3);
        let (out, _) =
            upstream_head("GET / HTTP/1.1\r\n\r\n", "::1", 80, "GET / HTTP/1.1\r\n").unwrap();
        assert!(out.contains("Host: [::1]\r\n"), "{out}");
        for (bad, code) in [
            ("Transfer-Encoding: chunked", 411),
            ("Content-Length: 1\r\nContent-Length: 2", 400),
            ("X: a\r\n folded", 400),
            ("Bad Name: x", 400),
        ] {
            let head = format!("POST http://a/ HTTP/1.1\r\n{bad}\r\n\r\n");
            assert_eq!(
                upstream_head(&head, "a", 80, "").unwrap_err().0,
                code,
                "{bad}"
            );
        }
    }
}
