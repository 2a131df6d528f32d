//! Command-line flags (each also read from an environment variable).

use crate::provisioner::Config;
use forkyard_common::config::{StateDirArg, TemporalArgs, parse_listen};
use std::{net::SocketAddr, path::PathBuf, time::Duration};

#[derive(Debug, clap::Parser)]
#[command(
    name = "sandbox-provisioner",
    about = "Forkyard sandbox provisioner: bubblewrap sandboxes over gRPC and Temporal"
)]
pub struct Args {
    /// gRPC listen address.
    #[arg(long, env = "FORKYARD_LISTEN", default_value = "127.0.0.1:50052")]
    pub listen: String,
    /// gRPC endpoint other services reach this replica at (stored on each sandbox);
    /// default `http://<listen>`.
    #[arg(long, env = "FORKYARD_ADVERTISE_ENDPOINT")]
    pub advertise_endpoint: Option<String>,
    #[command(flatten)]
    pub temporal: TemporalArgs,
    #[command(flatten)]
    pub state: StateDirArg,
    /// The bubblewrap binary (a path or a name on $PATH).
    #[arg(long, env = "FORKYARD_BWRAP_PATH", default_value = "bwrap")]
    pub bwrap_path: PathBuf,
    /// Exec wall-clock limit when a request gives none.
    #[arg(long, env = "FORKYARD_EXEC_TIMEOUT_SECS", default_value_t = 600)]
    pub exec_timeout_secs: u64,
    /// Limit for cloning a sandbox's repository.
    #[arg(long, env = "FORKYARD_CLONE_TIMEOUT_SECS", default_value_t = 300)]
    pub clone_timeout_secs: u64,
}

impl Args {
    /// The listen address and the core's settings; errors name the setting.
    pub fn resolve(&self) -> Result<(SocketAddr, Config), String> {
        let listen = parse_listen("FORKYARD_LISTEN (--listen)", &self.listen)?;
        if self.exec_timeout_secs == 0 {
            return Err(
                "FORKYARD_EXEC_TIMEOUT_SECS (--exec-timeout-secs) must be at least 1".into(),
            );
        }
        if self.clone_timeout_secs == 0 {
            return Err(
                "FORKYARD_CLONE_TIMEOUT_SECS (--clone-timeout-secs) must be at least 1".into(),
            );
        }
        let advertise = match &self.advertise_endpoint {
            Some(e) if e.trim().is_empty() => {
                return Err("FORKYARD_ADVERTISE_ENDPOINT (--advertise-endpoint) is empty".into());
            }
            Some(e) => e.trim().to_owned(),
            None => format!("http://{listen}"),
        };
        let state_dir = self.state.ensure()?;
        let config = Config {
            state_dir,
            bwrap_path: self.bwrap_path.clone(),
            advertise_endpoint: advertise,
            exec_timeout: Duration::from_secs(self.exec_timeout_secs),
            clone_timeout: Duration::from_secs(self.clone_timeout_secs),
        };
        Ok((listen, config))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[test]
    fn defaults_and_errors_name_the_setting() {
        let tmp = tempfile::tempdir().unwrap();
        let state = tmp.path().to_str().unwrap();
        let args = Args::try_parse_from(["sandbox-provisioner", "--state-dir", state]).unwrap();
        let (listen, config) = args.resolve().unwrap();
        assert_eq!(listen.to_string(), "127.0.0.1:50052");
        assert_eq!(config.advertise_endpoint, "http://127.0.0.1:50052");
        assert_eq!(config.exec_timeout, Duration::from_secs(600));

        let args = Args::try_parse_from([
            "sandbox-provisioner",
            "--state-dir",
            state,
            "--listen",
            "nope",
        ])
        .unwrap();
        assert!(args.resolve().unwrap_err().contains("--listen"));
        let args = Args::try_parse_from([
            "sandbox-provisioner",
            "--state-dir",
            state,
            "--exec-timeout-secs",
            "0",
        ])
        .unwrap();
        assert!(
            args.resolve()
                .unwrap_err()
                .contains("FORKYARD_EXEC_TIMEOUT_SECS")
        );
    }
}
