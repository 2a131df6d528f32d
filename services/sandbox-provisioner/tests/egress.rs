//! Egress through the allowlist proxy: the sandbox keeps its own network namespace and
//! reaches only listed hosts, through the provisioner's proxy. Loopback targets only.

mod common;

use common::fixture;
use forkyard_sandbox_provisioner::error::ProvisionerError;
use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};
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
    forkyard_common::testing::requires(
        forkyard_common::testing::Need::Installed("/usr/bin/curl"),
        std::path::Path::new("/usr/bin/curl").exists(),
        "curl in the sandbox through the proxy",
    )
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

/// Entries that are no host and port a sandbox could mean, and addresses in the blocks
/// that are not public which the egress checks used to miss: refused at create, naming
/// the field (an operator's FORKYARD_EGRESS_PRIVATE_ALLOWED lists the exceptions).
#[tokio::test]
async fn egress_entries_that_name_no_public_host_are_refused() {
    let f = fixture().await;
    let long = format!("{}.example", "a".repeat(250));
    for bad in [
        "*",
        "host:0",
        "host:65536",
        long.as_str(),
        "100.64.0.1:80",
        "100.100.100.200",
        "198.18.0.1:80",
        "224.0.0.1:80",
        "240.0.0.1",
        "0.0.0.1",
        "[64:ff9b::a9fe:a9fe]:80",
        "[2002:a00:1::1]:80",
        "[::ffff:10.0.0.1]:80",
        "[fec0::1]:80",
        "[2001:db8::1]:80",
        "[ff02::1]:80",
    ] {
        let mut req = f.request("forkyard-fork-1");
        req.egress_allow = vec![bad.to_owned()];
        match f.core.create(req).await {
            Err(ProvisionerError::InvalidArgument { field, .. }) => {
                assert_eq!(field, "egress_allow", "{bad}");
            }
            other => panic!("{bad}: {other:?}"),
        }
    }
    assert!(f.sandbox_dirs().is_empty());
}

/// This machine's own name: a host name (no IP literal, no `localhost`) that resolves to
/// the host itself; `None` where it resolves to a public address.
async fn own_name() -> Option<String> {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname").ok()?;
    let name = name.trim().to_owned();
    let addrs: Vec<_> = tokio::net::lookup_host((name.as_str(), 80))
        .await
        .ok()?
        .collect();
    let internal = !addrs.is_empty()
        && addrs
            .iter()
            .all(|a| forkyard_common::hosts::internal(a.ip()));
    internal.then_some(name)
}

/// A listed host name that resolves to the provisioner's own host (DNS rebinding onto
/// its services) is refused by the proxy when it resolves, and the server there is
/// never reached.
#[tokio::test]
async fn a_listed_name_resolving_to_the_host_itself_is_refused() {
    if !has_curl() {
        return;
    }
    let Some(name) = own_name().await else {
        forkyard_common::testing::skip(
            "this machine's name does not resolve to an internal address",
        );
        return;
    };
    let hits = Arc::new(AtomicUsize::new(0));
    let port = counting_server(hits.clone()).await;
    let f = fixture().await;
    let mut req = f.request("forkyard-fork-1");
    req.egress_allow = vec![format!("{name}:{port}")];
    let sbx = f.core.create(req).await.unwrap();
    for how in ["", "-p -x http://127.0.0.1:3128"] {
        let cmd = format!(
            "NO_PROXY= no_proxy= curl -s -w ' %{{http_code}} %{{http_connect}}' {how} --max-time 10 http://{name}:{port}/"
        );
        let out = f.sh(&sbx.id, &cmd).await;
        assert!(out.stdout.contains("403"), "{how}: {out:?}");
        assert!(!out.stdout.contains("reached"), "{how}: {out:?}");
    }
    assert_eq!(hits.load(Ordering::SeqCst), 0, "the server was reached");
}

/// A server on 127.0.0.1 that counts its connections and answers `reached`.
async fn counting_server(hits: Arc<AtomicUsize>) -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            hits.fetch_add(1, Ordering::SeqCst);
            let _ = s
                .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 7\r\n\r\nreached")
                .await;
        }
    });
    port
}
