//! A sandbox opening tunnels through its egress proxy by the dozen: the proxy holds at
//! most its cap of them at once (each is two of the provisioner's descriptors), and the
//! rest go through as the first end. Loopback targets only.

mod common;

use common::fixture_with;
use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

/// A host service that keeps each connection a moment, then closes it: the most it held
/// at once, and how many it got.
async fn slow_server() -> (u16, Arc<AtomicUsize>, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (open, most, total) = (
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicUsize::new(0)),
    );
    let (o, m, t) = (open.clone(), most.clone(), total.clone());
    tokio::spawn(async move {
        while let Ok((conn, _)) = listener.accept().await {
            t.fetch_add(1, Ordering::SeqCst);
            m.fetch_max(o.fetch_add(1, Ordering::SeqCst) + 1, Ordering::SeqCst);
            let o = o.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(200)).await;
                o.fetch_sub(1, Ordering::SeqCst);
                drop(conn);
            });
        }
    });
    (port, most, total)
}

#[tokio::test]
async fn a_sandbox_holds_at_most_its_egress_cap_of_tunnels() {
    let (port, most, total) = slow_server().await;
    let f = fixture_with(|_, c| c.egress.max_connections = 4).await;
    let mut req = f.request("forkyard-fork-1");
    req.network = true;
    req.egress_allow = vec![format!("127.0.0.1:{port}")];
    let sbx = f.core.create(req).await.unwrap();
    // 30 tunnels asked for at once, then each one's answer and end read, in a thread of
    // its own, and the tunnel closed, as a client does: how many were established. (The
    // proxy takes them in no particular order: a client reading one after another would
    // wait on one not taken yet while those taken wait for it to close them.)
    let script = format!(
        r#"import socket, threading
conns = [socket.create_connection(("127.0.0.1", 3128)) for _ in range(30)]
for c in conns:
    c.sendall(b"CONNECT 127.0.0.1:{port} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n")
answers = []
def finish(c):
    c.settimeout(120)
    answer = b""
    while True:
        part = c.recv(4096)
        if not part:
            break
        answer += part
    c.close()
    answers.append(answer.startswith(b"HTTP/1.1 200"))
threads = [threading.Thread(target=finish, args=(c,)) for c in conns]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(sum(answers))
"#
    );
    f.core
        .write_file(forkyard_proto::sandbox::v1::WriteFileRequest {
            sandbox_id: sbx.id.clone(),
            path: "tunnels.py".into(),
            content: script.into_bytes(),
            mode: 0o644,
        })
        .await
        .unwrap();
    let out = f.sh(&sbx.id, "python3 tunnels.py").await;
    assert_eq!(out.exit_code, 0, "{}", out.stderr);
    assert_eq!(
        out.stdout.trim(),
        "30",
        "every tunnel goes through in its turn"
    );
    assert_eq!(total.load(Ordering::SeqCst), 30);
    let most = most.load(Ordering::SeqCst);
    assert!(
        most <= 4,
        "the proxy held {most} of the sandbox's tunnels at once"
    );
}
