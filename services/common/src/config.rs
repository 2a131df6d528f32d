//! Flags every service accepts. Each flag also reads an environment variable, so the
//! same binary is configured by `--flag` locally and by env in Compose or Kubernetes.

use std::path::PathBuf;

/// Exit code for bad configuration (EX_USAGE from sysexits.h).
pub const EXIT_CONFIG: i32 = 64;

/// Print a readable configuration error and exit 64, so a crash-looping pod names the
/// setting in its first log line.
pub fn exit_config_error(msg: impl std::fmt::Display) -> ! {
    eprintln!("configuration error: {msg}");
    std::process::exit(EXIT_CONFIG)
}

#[derive(Debug, Clone, clap::Args)]
pub struct TemporalArgs {
    /// Temporal frontend address (host:port or URL).
    #[arg(
        long = "temporal-address",
        env = "TEMPORAL_ADDRESS",
        default_value = "localhost:7233"
    )]
    pub address: String,
    /// Temporal namespace.
    #[arg(
        long = "temporal-namespace",
        env = "TEMPORAL_NAMESPACE",
        default_value = "default"
    )]
    pub namespace: String,
    /// How long to keep retrying the first connection to Temporal at start-up.
    #[arg(
        long = "temporal-connect-timeout-secs",
        env = "FORKYARD_TEMPORAL_CONNECT_TIMEOUT_SECS",
        default_value_t = 60
    )]
    pub connect_timeout_secs: u64,
}

impl TemporalArgs {
    /// The frontend URL, accepting both `host:port` and `http(s)://host:port`.
    pub fn url(&self) -> Result<url::Url, String> {
        let raw = self.address.trim();
        if raw.is_empty() {
            return Err("TEMPORAL_ADDRESS (--temporal-address) is empty".into());
        }
        let with_scheme = if raw.contains("://") {
            raw.to_owned()
        } else {
            format!("http://{raw}")
        };
        let url = url::Url::parse(&with_scheme).map_err(|e| {
            format!("TEMPORAL_ADDRESS (--temporal-address) {raw:?} is not an address: {e}")
        })?;
        if url.host_str().is_none() || url.port_or_known_default().is_none() {
            return Err(format!(
                "TEMPORAL_ADDRESS (--temporal-address) {raw:?} needs a host and port"
            ));
        }
        Ok(url)
    }
}

#[derive(Debug, Clone, clap::Args)]
pub struct StateDirArg {
    /// Directory for local state (databases, workspaces, logs).
    #[arg(
        long = "state-dir",
        env = "FORKYARD_STATE_DIR",
        default_value = ".forkyard"
    )]
    pub state_dir: PathBuf,
}

impl StateDirArg {
    /// The state directory, created if missing, as an absolute path.
    pub fn ensure(&self) -> Result<PathBuf, String> {
        std::fs::create_dir_all(&self.state_dir).map_err(|e| {
            format!(
                "FORKYARD_STATE_DIR (--state-dir) {}: cannot create: {e}",
                self.state_dir.display()
            )
        })?;
        std::fs::canonicalize(&self.state_dir).map_err(|e| {
            format!(
                "FORKYARD_STATE_DIR (--state-dir) {}: {e}",
                self.state_dir.display()
            )
        })
    }
}

/// Parse a `host:port` listen address, naming the setting on failure.
pub fn parse_listen(flag: &str, value: &str) -> Result<std::net::SocketAddr, String> {
    value
        .parse()
        .map_err(|e| format!("{flag} {value:?} is not a host:port socket address: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(address: &str) -> TemporalArgs {
        TemporalArgs {
            address: address.into(),
            namespace: "default".into(),
            connect_timeout_secs: 1,
        }
    }

    #[test]
    fn temporal_address_accepts_host_port_and_url() {
        assert_eq!(
            args("localhost:7233").url().unwrap().as_str(),
            "http://localhost:7233/"
        );
        assert_eq!(
            args("https://x.tmprl.cloud:7233").url().unwrap().port(),
            Some(7233)
        );
    }

    #[test]
    fn bad_temporal_address_names_the_setting() {
        let err = args("").url().unwrap_err();
        assert!(err.contains("TEMPORAL_ADDRESS"), "{err}");
        let err = args("not a url:::").url().unwrap_err();
        assert!(err.contains("TEMPORAL_ADDRESS"), "{err}");
    }

    #[test]
    fn listen_address_error_names_the_flag() {
        assert!(parse_listen("--listen", "127.0.0.1:50051").is_ok());
        let err = parse_listen("--listen", "nope").unwrap_err();
        assert!(err.contains("--listen"), "{err}");
    }
}
