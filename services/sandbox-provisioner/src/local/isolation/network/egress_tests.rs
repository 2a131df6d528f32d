//! The egress allowlist: what its entries match and refuse, names resolving into
//! an internal block refused, and a plain-HTTP request sent once, to the host checked.

use super::*;
use tokio::io::AsyncReadExt;

#[test]
fn allowlist_matching() {
    let a = Allowlist::parse(&[
        "example.com".into(),
        "*.github.com".into(),
        "127.0.0.1:8080".into(),
        "[::1]:8080".into(),
    ])
    .unwrap();
    assert!(a.allows("example.com", 443));
    assert!(a.allows("EXAMPLE.com", 80));
    assert!(!a.allows("evil-example.com", 443));
    assert!(a.allows("api.github.com", 443));
    assert!(!a.allows("github.com", 443));
    assert!(a.allows("127.0.0.1", 8080));
    assert!(!a.allows("127.0.0.1", 8081));
    assert!(a.allows("[::1]", 8080) && a.allows("0:0::1", 8080));
}

/// Entries that name no host or port a sandbox could mean: every host, port 0 or one
/// past 65535 (taken before as "any port"), a host longer than DNS allows.
#[test]
fn entries_that_are_no_host_and_port_are_refused() {
    for bad in [
        "*",
        "*.",
        "a b",
        "a.*.com",
        "host:0",
        "host:65536",
        "host:99999",
        "host:http",
        "[::1",
        &format!("{}.com", "a".repeat(250)),
        &format!("{}.example:443", "a".repeat(245)),
    ] {
        assert!(Allowlist::parse(&[bad.to_owned()]).is_err(), "{bad:?}");
    }
    assert!(Allowlist::parse(&["host:65535".into(), "h:1".into()]).is_ok());
}

/// The proxy on a socket in a temporary directory, allowing `entries`.
async fn proxy(entries: &[String]) -> (tempfile::TempDir, std::path::PathBuf, CancellationToken) {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("egress.sock");
    let stop = CancellationToken::new();
    spawn(
        &socket,
        Allowlist::parse(entries).unwrap(),
        Limits {
            max_connections: 64,
            header_timeout: Duration::from_millis(300),
            idle_timeout: Duration::from_millis(600),
        },
        stop.clone(),
    )
    .unwrap();
    (dir, socket, stop)
}

/// Send `request` through the proxy; all it answers, to the end.
async fn ask(socket: &Path, request: &str) -> String {
    let mut s = UnixStream::connect(socket).await.unwrap();
    s.write_all(request.as_bytes()).await.unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    out
}

/// Names the system's resolver reads as an address in each IPv4 block that is not
/// public (inet_aton's short forms: `127.1` is 127.0.0.1; no DNS needed). The proxy
/// must refuse them when they resolve, whatever the allowlist says; before, the blocks
/// hosts::internal missed were connected to.
#[tokio::test]
async fn names_resolving_into_any_internal_block_are_refused() {
    let names = [
        ("0.1", "this network"),
        ("10.1", "private 10/8"),
        ("100.64.1", "CGNAT"),
        ("127.1", "loopback"),
        ("169.254.43518", "metadata 169.254.169.254"),
        ("172.16.1", "private 172.16/12"),
        ("192.0.8", "IETF protocol assignments"),
        ("192.0.513", "TEST-NET-1"),
        ("192.88.25345", "6to4 relay anycast"),
        ("192.168.1", "private 192.168/16"),
        ("198.18.1", "benchmarking"),
        ("198.51.25601", "TEST-NET-2"),
        ("203.0.28929", "TEST-NET-3"),
        ("224.1", "multicast"),
        ("240.1", "reserved"),
        ("4294967295", "limited broadcast"),
    ];
    let entries: Vec<String> = names.iter().map(|(n, _)| format!("{n}:80")).collect();
    let (_dir, socket, stop) = proxy(&entries).await;
    for (name, block) in names {
        for request in [
            format!("CONNECT {name}:80 HTTP/1.1\r\n\r\n"),
            format!("GET http://{name}/ HTTP/1.1\r\n\r\n"),
        ] {
            let answer = ask(&socket, &request).await;
            assert!(
                answer.starts_with("HTTP/1.1 403 ")
                    && answer.contains("resolves to an internal address"),
                "{name} ({block}): {answer}"
            );
        }
    }
    stop.cancel();
}

/// Names resolving into an IPv6 block that is not public (no resolver here answers a
/// name with them, so the addresses are given as a resolver would): each refused, also
/// when it comes after a public address, and a name whose addresses are all public is
/// let through.
#[test]
fn names_resolving_into_any_internal_ipv6_block_are_refused() {
    let public: std::net::SocketAddr = "[2606:4700::1111]:443".parse().unwrap();
    for (addr, block) in [
        ("::1", "loopback"),
        ("::ffff:10.0.0.1", "IPv4-mapped"),
        ("64:ff9b::a00:1", "NAT64 carrying 10.0.0.1"),
        ("64:ff9b::a9fe:a9fe", "NAT64 carrying the metadata address"),
        ("64:ff9b:1::1", "NAT64 local use"),
        ("2002:a00:1::1", "6to4 carrying 10.0.0.1"),
        ("2001:db8::1", "documentation"),
        ("fc00::1", "unique local"),
        ("fd12:3456::1", "unique local"),
        ("fe80::1", "link-local"),
        ("fec0::1", "site-local"),
        ("ff02::1", "multicast"),
        ("100::1", "discard"),
        ("2001::1", "Teredo"),
    ] {
        let internal = std::net::SocketAddr::new(addr.parse().unwrap(), 443);
        for addrs in [vec![internal], vec![public, internal]] {
            let refused = all_public("pkg.example", &addrs).unwrap_err();
            assert_eq!(refused.0, 403, "{addr} ({block})");
            assert!(
                refused.1.contains("resolves to an internal address"),
                "{refused:?}"
            );
        }
    }
    let nat64_public = "[64:ff9b::808:808]:443".parse().unwrap();
    assert!(all_public("pkg.example", &[public, nat64_public]).is_ok());
}

/// A connection that sends no request head, or goes quiet in a tunnel, is closed at its
/// timeout (a sandbox cannot hold the provisioner's descriptors with silent
/// connections): the head's with `408`, the tunnel's by closing both sides.
#[tokio::test]
async fn silent_connections_are_closed_at_their_timeouts() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let upstream_closed = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        let mut buf = [0u8; 64];
        // Quiet until the proxy closes the tunnel: read returns 0 (or fails).
        matches!(s.read(&mut buf).await, Ok(0) | Err(_))
    });
    let (_dir, socket, stop) = proxy(&[format!("127.0.0.1:{port}")]).await;

    // Half a head, then nothing.
    let mut s = UnixStream::connect(&socket).await.unwrap();
    s.write_all(b"CONNECT 127.0.0.1:1 HTTP/1.1\r\n")
        .await
        .unwrap();
    let mut answer = String::new();
    let read = tokio::time::timeout(Duration::from_secs(10), s.read_to_string(&mut answer));
    read.await.expect("closed at the header timeout").unwrap();
    assert!(answer.starts_with("HTTP/1.1 408 "), "{answer}");

    // A tunnel nobody uses.
    let mut s = UnixStream::connect(&socket).await.unwrap();
    let connect = format!("CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n");
    s.write_all(connect.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut answer));
    read.await.expect("closed at the idle timeout").ok();
    assert!(answer.starts_with(b"HTTP/1.1 200 "), "{answer:?}");
    let closed = tokio::time::timeout(Duration::from_secs(10), upstream_closed);
    assert!(closed.await.expect("upstream closed too").unwrap());
    stop.cancel();
}

/// A loopback server that takes one connection, answers `ok` and keeps everything it
/// was sent (to the connection's end): what reached it.
async fn recording_server() -> (u16, tokio::task::JoinHandle<String>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let got = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        let mut seen = Vec::new();
        let mut buf = [0u8; 4096];
        while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = s.read(&mut buf).await.unwrap();
            if n == 0 {
                break;
            }
            seen.extend_from_slice(&buf[..n]);
        }
        let _ = s
            .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
            .await;
        let _ = s.shutdown().await;
        let _ = s.read_to_end(&mut seen).await;
        String::from_utf8_lossy(&seen).into_owned()
    });
    (port, got)
}

/// The request's own Host header picked another site on the checked address, and a
/// request pipelined behind the first went out unchecked: now one request goes, to the
/// host that was checked.
#[tokio::test]
async fn a_plain_http_request_goes_once_to_the_checked_host() {
    let (port, got) = recording_server().await;
    let (_dir, socket, stop) = proxy(&[format!("127.0.0.1:{port}")]).await;
    let smuggled = format!(
        "GET http://127.0.0.1:{port}/a HTTP/1.1\r\nHost: evil.example\r\nUser-Agent: t\r\n\r\n\
         GET http://127.0.0.1:{port}/b HTTP/1.1\r\nHost: evil.example\r\n\r\n"
    );
    let answer = ask(&socket, &smuggled).await;
    assert!(answer.ends_with("\r\n\r\nok"), "{answer}");
    let seen = got.await.unwrap();
    assert_eq!(
        seen,
        format!(
            "GET /a HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\nUser-Agent: t\r\n\r\n"
        )
    );
    stop.cancel();
}
