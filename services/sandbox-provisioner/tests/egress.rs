//! Egress through the allowlist proxy: the sandbox keeps its own network namespace and
//! reaches only listed hosts, through the provisioner's proxy. Loopback targets only.

mod common;

use common::fixture;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A tiny HTTP server on 127.0.0.1 answering every request with `body`.
async fn http_server(body: &'static str) -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                let _ = s.read(&mut buf).await;
                let resp = format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = s.write_all(resp.as_bytes()).await;
            });
        }
    });
    port
}

fn has_curl() -> bool {
    let ok = std::path::Path::new("/usr/bin/curl").exists();
    if !ok {
        eprintln!("SKIPPED: /usr/bin/curl not installed");
    }
    ok
}

#[tokio::test]
async fn only_allowlisted_hosts_are_reachable_through_the_proxy() {
    if !has_curl() {
        return;
    }
    let port = http_server("hello from the allowed host").await;
    let other = http_server("must not be reached").await;
    let f = fixture().await;
    let mut req = f.request("forkyard-fork-1");
    req.network = true;
    req.egress_allow = vec![format!("127.0.0.1:{port}")];
    let sbx = f.core.create(req).await.unwrap();
    assert_eq!(sbx.egress_allow, vec![format!("127.0.0.1:{port}")]);

    // Allowed: through the proxy (HTTP_PROXY is set in the sandbox; NO_PROXY is cleared
    // here so curl uses the proxy for 127.0.0.1 too).
    let allowed = format!("NO_PROXY= no_proxy= curl -sS --max-time 10 http://127.0.0.1:{port}/x");
    let out = f.sh(&sbx.id, &allowed).await;
    assert_eq!(out.stdout, "hello from the allowed host", "{out:?}");

    // HTTPS-style tunnel (CONNECT) to the allowed host works too.
    let connect = format!(
        "NO_PROXY= curl -sS --max-time 10 -p -x http://127.0.0.1:3128 http://127.0.0.1:{port}/y"
    );
    let out = f.sh(&sbx.id, &connect).await;
    assert_eq!(out.stdout, "hello from the allowed host", "{out:?}");

    // Another port of the same host, or another name: 403 from the proxy.
    for target in [
        format!("http://127.0.0.1:{other}/"),
        format!("http://localhost:{port}/"),
    ] {
        let cmd = format!(
            "NO_PROXY= no_proxy= curl -s -o /dev/null -w '%{{http_code}}' --max-time 10 {target}"
        );
        let out = f.sh(&sbx.id, &cmd).await;
        assert_eq!(out.stdout, "403", "{target}: {out:?}");
    }
    let cmd = format!(
        "NO_PROXY= curl -s -o /dev/null -w '%{{http_connect}}' -p -x http://127.0.0.1:3128 --max-time 10 http://127.0.0.1:{other}/"
    );
    let out = f.sh(&sbx.id, &cmd).await;
    assert_eq!(out.stdout, "403", "CONNECT to a refused port: {out:?}");

    // Direct connections (bypassing the proxy) go nowhere: own network namespace.
    let out = f
        .sh(
            &sbx.id,
            &format!("curl -sS --noproxy '*' --max-time 5 http://127.0.0.1:{port}/"),
        )
        .await;
    assert_ne!(out.exit_code, 0, "direct connection succeeded: {out:?}");
    let out = f
        .sh(
            &sbx.id,
            "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '",
        )
        .await;
    assert_eq!(out.stdout, "lo\n", "only loopback in the sandbox's netns");
}

#[tokio::test]
async fn sandboxes_without_egress_have_no_proxy() {
    let f = fixture().await;
    let sbx = f.create().await;
    let out = f
        .sh(
            &sbx.id,
            "env | grep -ci proxy; ls /run/forkyard 2>&1 | head -1",
        )
        .await;
    assert!(out.stdout.starts_with("0\n"), "{out:?}");
    let _ = Duration::ZERO;
}
