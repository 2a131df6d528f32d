//! `forkyard-health [ADDR] [SERVICE]`: one `grpc.health.v1` check of a Forkyard service
//! on this host, for container healthchecks (Docker, Compose), where a gRPC probe is not
//! built in as it is in Kubernetes. Exits 0 when the service answers SERVING, 1 when it
//! answers otherwise or not at all (within 3 s), 64 on bad arguments. With the mesh's
//! TLS settings in the environment (the container's own `FORKYARD_TLS_*`), it dials TLS
//! and presents the service's certificate, as the mesh's clients do.

#![forbid(unsafe_code)]

use clap::Parser;
use forkyard_common::tls::{ClientAuth, TlsArgs};
use std::{process::ExitCode, time::Duration};
use tonic_health::pb::{
    HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
};

#[derive(Parser)]
#[command(
    name = "forkyard-health",
    about = "One gRPC health check (for container healthchecks)"
)]
struct Args {
    /// The service's address on this host.
    #[arg(default_value = "http://127.0.0.1:50051")]
    addr: String,
    /// The health service name to ask about; empty: the server as a whole.
    #[arg(default_value = "")]
    service: String,
    #[command(flatten)]
    tls: TlsArgs,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args = Args::parse();
    if let Err(e) = args.tls.install(ClientAuth::Required) {
        eprintln!("forkyard-health: {e}");
        return ExitCode::from(64);
    }
    let addr = if args.addr.contains("://") {
        args.addr
    } else {
        format!("http://{}", args.addr)
    };
    let checked = async {
        let channel = forkyard_common::tls::endpoint(&addr)?
            .connect()
            .await
            .map_err(|e| e.to_string())?;
        HealthClient::new(channel)
            .check(HealthCheckRequest {
                service: args.service,
            })
            .await
            .map(|r| r.into_inner().status)
            .map_err(|s| s.message().to_owned())
    };
    match tokio::time::timeout(Duration::from_secs(3), checked).await {
        Ok(Ok(status)) if status == ServingStatus::Serving as i32 => ExitCode::SUCCESS,
        Ok(Ok(status)) => {
            let name = ServingStatus::try_from(status).map_or("UNKNOWN", |s| s.as_str_name());
            eprintln!("forkyard-health: {addr} is {name}");
            ExitCode::from(1)
        }
        Ok(Err(e)) => {
            eprintln!("forkyard-health: {addr}: {e}");
            ExitCode::from(1)
        }
        Err(_) => {
            eprintln!("forkyard-health: {addr}: no answer in 3 s");
            ExitCode::from(1)
        }
    }
}
