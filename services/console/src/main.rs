//! `console`: the run console's HTTP server, in front of the gateway's gRPC API.

use clap::Parser;
use forkyard_common::{config::exit_config_error, http_limits};
use forkyard_console::{AppState, DEFAULT_LISTEN, gateway::Gateway, router};
use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    time::Duration,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[derive(Debug, Parser)]
#[command(
    name = "console",
    about = "Forkyard console: runs and forks in the browser"
)]
struct Args {
    /// HTTP listen address.
    #[arg(long, env = "FORKYARD_CONSOLE_LISTEN", default_value = DEFAULT_LISTEN)]
    listen: String,
    /// The gateway's gRPC endpoint; every call carries the visitor's own API key.
    #[arg(
        long,
        env = "FORKYARD_GATEWAY",
        default_value = "http://127.0.0.1:50051"
    )]
    gateway: String,
    /// Mark cookies `Secure`: set when the console is reached over https (a TLS proxy
    /// in front of it). A proxy's `X-Forwarded-Proto: https` does so per request.
    #[arg(long, env = "FORKYARD_CONSOLE_SECURE_COOKIES", default_value_t = false)]
    secure_cookies: bool,
    /// Connections held at once (an open run page holds one for its live updates).
    #[arg(
        long,
        env = "FORKYARD_CONSOLE_MAX_CONNECTIONS",
        default_value_t = 256,
        value_parser = clap::value_parser!(u32).range(1..)
    )]
    max_connections: u32,
    /// Check a running console instead of starting one: GET /healthz at the listen
    /// address (0.0.0.0 or [::] asked on loopback), exit 0 on 200, else 1. The images'
    /// healthcheck (they carry no curl).
    #[arg(long)]
    check: bool,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // Bad flags exit 64 (EX_USAGE), as every service's do.
    let args = Args::try_parse().unwrap_or_else(|e| {
        if e.use_stderr() {
            exit_config_error(e)
        }
        e.exit()
    });
    if args.check {
        let result = match args.listen.parse() {
            Ok(addr) => check_healthz(addr).await,
            Err(e) => Err(format!("{:?} is not host:port: {e}", args.listen)),
        };
        if let Err(e) = &result {
            eprintln!("console --check: {e}");
        }
        std::process::exit(i32::from(result.is_err()));
    }
    if !args.gateway.starts_with("http://") {
        exit_config_error(format!(
            "--gateway (FORKYARD_GATEWAY): {:?}: an http:// endpoint (TLS to the gateway is not supported yet)",
            args.gateway
        ));
    }
    let gateway = Gateway::connect_lazy(&args.gateway)
        .unwrap_or_else(|e| exit_config_error(format!("--gateway (FORKYARD_GATEWAY): {e}")));
    let addr: SocketAddr = args.listen.parse().unwrap_or_else(|e| {
        exit_config_error(format!(
            "--listen (FORKYARD_CONSOLE_LISTEN): {:?} is not host:port: {e}",
            args.listen
        ))
    });
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .unwrap_or_else(|e| {
            exit_config_error(format!(
                "--listen (FORKYARD_CONSOLE_LISTEN): cannot listen on {addr}: {e}"
            ))
        });
    forkyard_common::telemetry::init("console");
    let app = router(AppState {
        gateway,
        secure_cookies: args.secure_cookies,
    });
    let limits = http_limits::Limits {
        max_connections: http_limits::quarter_of_open_files(args.max_connections as usize),
        header_timeout: Duration::from_secs(30),
        // Longer than the live pages' keep-alive comments (15 s).
        idle_timeout: Duration::from_secs(120),
    };
    tracing::info!(listen = %addr, gateway = %args.gateway, "console listening on http://{addr}");
    http_limits::serve(
        listener,
        limits,
        app,
        forkyard_common::shutdown::signal_received(),
    )
    .await;
    tracing::info!("console stopped");
    forkyard_common::telemetry::shutdown();
    Ok(())
}

/// One `GET /healthz` of the console listening on `addr` (an unspecified address is
/// asked on loopback): Ok on a 200 within 3 s.
async fn check_healthz(mut addr: SocketAddr) -> Result<(), String> {
    if addr.ip().is_unspecified() {
        addr.set_ip(match addr.ip() {
            IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::LOCALHOST),
            IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::LOCALHOST),
        });
    }
    let get = async {
        let mut stream = tokio::net::TcpStream::connect(addr).await?;
        let request = format!("GET /healthz HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await?;
        let mut response = Vec::new();
        stream.take(4096).read_to_end(&mut response).await?;
        Ok::<_, std::io::Error>(response)
    };
    let response = tokio::time::timeout(Duration::from_secs(3), get)
        .await
        .map_err(|_| format!("{addr}: no answer in 3 s"))?
        .map_err(|e| format!("{addr}: {e}"))?;
    let status = String::from_utf8_lossy(&response);
    let status = status.lines().next().unwrap_or_default();
    if status.starts_with("HTTP/1.1 200 ") || status.starts_with("HTTP/1.0 200 ") {
        Ok(())
    } else {
        Err(format!("{addr}/healthz answered {status:?}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn serve(app: axum::Router) -> SocketAddr {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        addr
    }

    #[tokio::test]
    async fn check_passes_on_the_consoles_healthz_and_fails_otherwise() {
        let console = serve(router(AppState {
            gateway: Gateway::connect_lazy("http://127.0.0.1:9").unwrap(),
            secure_cookies: false,
        }))
        .await;
        check_healthz(console).await.unwrap();
        // Asked on 0.0.0.0 (the images' listen address), it checks loopback.
        check_healthz(SocketAddr::new(
            Ipv4Addr::UNSPECIFIED.into(),
            console.port(),
        ))
        .await
        .unwrap();

        // Something else on the port that does not answer 200 there.
        let other = serve(axum::Router::new()).await;
        let e = check_healthz(other).await.unwrap_err();
        assert!(e.contains("404"), "{e}");

        // Nothing listening.
        let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = closed.local_addr().unwrap();
        drop(closed);
        assert!(check_healthz(addr).await.is_err());
    }
}
