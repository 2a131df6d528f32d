//! The janitor binary, started with 256 descriptors, against more idle connections to its
//! metrics port than it has descriptors (in production: 19,985 against 20,000). Its gRPC
//! port still answers, every idle connection is closed once its header timeout passes,
//! and the metrics page is served again afterwards.

use std::{net::SocketAddr, process::Stdio, time::Duration};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
};
use tonic_health::pb::{
    HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
};

/// More than the janitor's descriptors: every one accepted would leave gRPC none.
const IDLE_CONNECTIONS: usize = 300;
/// What stops a broken server from hanging the test; every wait is for a condition.
const GUARD: Duration = Duration::from_secs(120);

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The janitor with an open-files limit of 256, its metrics port capped at 16 connections
/// with one-second timeouts; Temporal is nowhere, so it serves health alone.
fn start_janitor(
    state: &std::path::Path,
    grpc: SocketAddr,
    metrics: SocketAddr,
) -> tokio::process::Child {
    tokio::process::Command::new("sh")
        .args(["-c", "ulimit -n 256 && exec \"$0\""])
        .arg(env!("CARGO_BIN_EXE_janitor"))
        .env("FORKYARD_LISTEN", grpc.to_string())
        .env("FORKYARD_METRICS_LISTEN", metrics.to_string())
        .env("FORKYARD_STATE_DIR", state)
        .env("TEMPORAL_ADDRESS", format!("127.0.0.1:{}", free_port()))
        .env("FORKYARD_METRICS_MAX_CONNECTIONS", "16")
        .env("FORKYARD_METRICS_HEADER_TIMEOUT_SECS", "1")
        .env("FORKYARD_METRICS_IDLE_TIMEOUT_SECS", "1")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("start the janitor")
}

/// The janitor's liveness over gRPC, `None` while it does not answer.
async fn alive(grpc: SocketAddr) -> Option<i32> {
    let check = async {
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{grpc}"))
            .ok()?
            .connect()
            .await
            .ok()?;
        let reply = HealthClient::new(channel)
            .check(HealthCheckRequest {
                service: forkyard_common::server::LIVENESS.into(),
            })
            .await
            .ok()?;
        Some(reply.into_inner().status)
    };
    tokio::time::timeout(Duration::from_secs(10), check)
        .await
        .ok()
        .flatten()
}

/// Whether the server ends `conn` (end of file, or a reset).
async fn closed_by_server(conn: &mut TcpStream) -> bool {
    let mut buf = [0u8; 256];
    let to_end = async {
        loop {
            match conn.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    };
    tokio::time::timeout(GUARD, to_end).await.is_ok()
}

async fn metrics_page(addr: SocketAddr) -> String {
    let fetch = async {
        let mut conn = TcpStream::connect(addr).await.ok()?;
        conn.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .ok()?;
        let mut page = String::new();
        conn.read_to_string(&mut page).await.ok()?;
        Some(page)
    };
    tokio::time::timeout(GUARD, fetch)
        .await
        .ok()
        .flatten()
        .unwrap_or_default()
}

#[tokio::test]
async fn idle_connections_to_the_metrics_port_never_starve_grpc() {
    let state = tempfile::tempdir().unwrap();
    let grpc: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let metrics: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let _janitor = start_janitor(state.path(), grpc, metrics);
    let started = tokio::time::Instant::now();
    while alive(grpc).await.is_none() {
        assert!(started.elapsed() < GUARD, "the janitor never answered");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let mut idle = Vec::with_capacity(IDLE_CONNECTIONS);
    for _ in 0..IDLE_CONNECTIONS {
        idle.push(TcpStream::connect(metrics).await.unwrap());
    }
    assert_eq!(
        alive(grpc).await,
        Some(ServingStatus::Serving as i32),
        "gRPC stopped answering with {IDLE_CONNECTIONS} idle metrics connections open"
    );
    for (i, conn) in idle.iter_mut().enumerate() {
        assert!(
            closed_by_server(conn).await,
            "idle connection {i} kept open"
        );
    }
    let page = metrics_page(metrics).await;
    assert!(page.starts_with("HTTP/1.1 200"), "{page}");
    assert!(page.contains("janitor_sweeps_total"), "{page}");
}
