//! `console`: the run console's HTTP server, in front of the gateway's gRPC API.

use clap::Parser;
use forkyard_common::{config::exit_config_error, http_limits};
use forkyard_console::{AppState, DEFAULT_LISTEN, gateway::Gateway, router};
use std::{net::SocketAddr, time::Duration};

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
