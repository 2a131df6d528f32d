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
    /// How long to keep retrying the first connection to Temporal at start-up, serving
    /// health NOT_SERVING meanwhile; 0 (the default): for as long as it takes.
    #[arg(
        long = "temporal-connect-timeout-secs",
        env = "FORKYARD_TEMPORAL_CONNECT_TIMEOUT_SECS",
        default_value_t = 0
    )]
    pub connect_timeout_secs: u64,
    /// gRPC compression to Temporal: `none` (default: on a LAN or in a cluster gzip only
    /// spends CPU on both ends; it was ~4% of the gateway's and more of the server's) or
    /// `gzip` (across a WAN, e.g. Temporal Cloud).
    #[arg(
        long = "temporal-grpc-compression",
        env = "TEMPORAL_GRPC_COMPRESSION",
        value_enum,
        default_value_t = Compression::None
    )]
    pub compression: Compression,
    #[command(flatten)]
    pub tls: TemporalTlsArgs,
    /// A Temporal Cloud API key, sent as `authorization: Bearer …` on every call; implies
    /// TLS (the system roots, unless TEMPORAL_TLS_CA names a CA). Give it in the
    /// environment (from a Secret), not on the command line.
    #[arg(
        long = "temporal-api-key",
        env = "TEMPORAL_API_KEY",
        hide_env_values = true
    )]
    pub api_key: Option<ApiKey>,
}

/// A secret that authenticates this service: never printed (`Debug` shows its length
/// only), handed to the client that sends it and nowhere else.
#[derive(Clone, PartialEq, Eq)]
pub struct ApiKey(String);

impl ApiKey {
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ApiKey(<{} bytes, redacted>)", self.0.len())
    }
}

impl std::str::FromStr for ApiKey {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let s = s.trim();
        if s.is_empty() || s.contains(['\r', '\n']) {
            return Err("an API key is one non-empty line".into());
        }
        Ok(Self(s.to_owned()))
    }
}

/// Transport compression of the calls to Temporal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Compression {
    None,
    Gzip,
}

/// TLS (and mTLS) to the Temporal frontend, as a Temporal cluster or Temporal Cloud wants.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct TemporalTlsArgs {
    /// PEM client certificate for mTLS to Temporal.
    #[arg(
        id = "temporal_tls_cert",
        long = "temporal-tls-cert",
        env = "TEMPORAL_TLS_CERT"
    )]
    pub cert: Option<PathBuf>,
    /// PEM private key of --temporal-tls-cert.
    #[arg(
        id = "temporal_tls_key",
        long = "temporal-tls-key",
        env = "TEMPORAL_TLS_KEY"
    )]
    pub key: Option<PathBuf>,
    /// PEM CA of the Temporal frontend's certificate (else the system roots).
    #[arg(
        id = "temporal_tls_ca",
        long = "temporal-tls-ca",
        env = "TEMPORAL_TLS_CA"
    )]
    pub ca: Option<PathBuf>,
    /// Server name to verify instead of the address's host.
    #[arg(
        id = "temporal_tls_server_name",
        long = "temporal-tls-server-name",
        env = "TEMPORAL_TLS_SERVER_NAME"
    )]
    pub server_name: Option<String>,
    /// TLS without a client certificate (e.g. an API-key namespace); implied by any other
    /// TEMPORAL_TLS_* setting.
    #[arg(
        id = "temporal_tls_enabled",
        long = "temporal-tls",
        env = "TEMPORAL_TLS",
        default_value_t = false
    )]
    pub enabled: bool,
}

impl TemporalTlsArgs {
    /// The client's TLS options; `None` when TLS to Temporal is off. Errors name the setting.
    pub fn options(&self) -> Result<Option<temporalio_client::TlsOptions>, String> {
        let read = |setting: &str, p: &std::path::Path| {
            std::fs::read(p).map_err(|e| format!("{setting} {}: cannot read: {e}", p.display()))
        };
        let client = match (&self.cert, &self.key) {
            (None, None) => None,
            (Some(_), None) => {
                return Err("--temporal-tls-key (TEMPORAL_TLS_KEY) is missing: TEMPORAL_TLS_CERT needs its private key".into());
            }
            (None, Some(_)) => {
                return Err("--temporal-tls-cert (TEMPORAL_TLS_CERT) is missing: TEMPORAL_TLS_KEY is set without a certificate".into());
            }
            (Some(c), Some(k)) => Some(
                temporalio_client::ClientTlsOptions::builder()
                    .client_cert(read("--temporal-tls-cert (TEMPORAL_TLS_CERT)", c)?)
                    .client_private_key(read("--temporal-tls-key (TEMPORAL_TLS_KEY)", k)?)
                    .build(),
            ),
        };
        let ca = self
            .ca
            .as_deref()
            .map(|p| read("--temporal-tls-ca (TEMPORAL_TLS_CA)", p))
            .transpose()?;
        if !self.enabled && client.is_none() && ca.is_none() && self.server_name.is_none() {
            return Ok(None);
        }
        Ok(Some(
            temporalio_client::TlsOptions::builder()
                .maybe_server_root_ca_cert(ca)
                .maybe_domain(self.server_name.clone())
                .maybe_client_tls_options(client)
                .build(),
        ))
    }
}

impl TemporalArgs {
    /// The frontend URL, accepting both `host:port` and `http(s)://host:port`. Every
    /// service checks it at start (exit 64), so the TEMPORAL_TLS_* settings are checked
    /// here too.
    pub fn url(&self) -> Result<url::Url, String> {
        self.tls.options()?;
        let raw = self.address.trim();
        if raw.is_empty() {
            return Err("--temporal-address (TEMPORAL_ADDRESS) is empty".into());
        }
        let with_scheme = if raw.contains("://") {
            raw.to_owned()
        } else {
            format!("http://{raw}")
        };
        let url = url::Url::parse(&with_scheme).map_err(|e| {
            format!("--temporal-address (TEMPORAL_ADDRESS) {raw:?} is not an address: {e}")
        })?;
        if url.host_str().is_none() || url.port_or_known_default().is_none() {
            return Err(format!(
                "--temporal-address (TEMPORAL_ADDRESS) {raw:?} needs a host and port"
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
    /// The state directory, created if missing (its owner's only:
    /// [`crate::private_files`]), as an absolute path.
    pub fn ensure(&self) -> Result<PathBuf, String> {
        crate::private_files::create_private_dir(&self.state_dir).map_err(|e| {
            format!(
                "--state-dir (FORKYARD_STATE_DIR) {}: cannot create: {e}",
                self.state_dir.display()
            )
        })?;
        std::fs::canonicalize(&self.state_dir).map_err(|e| {
            format!(
                "--state-dir (FORKYARD_STATE_DIR) {}: {e}",
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
            compression: Compression::None,
            tls: Default::default(),
            api_key: None,
        }
    }

    #[test]
    fn an_api_key_is_never_printed() {
        let key: ApiKey = " tmprl-secret-key \n".trim_end().parse().unwrap();
        assert_eq!(key.expose(), "tmprl-secret-key");
        let shown = format!(
            "{:?}",
            TemporalArgs {
                api_key: Some(key),
                ..args("x:1")
            }
        );
        assert!(!shown.contains("tmprl-secret-key"), "{shown}");
        assert!("a\nb".parse::<ApiKey>().is_err());
        assert!("  ".parse::<ApiKey>().is_err());
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
    fn temporal_tls_cert_without_key_names_the_setting() {
        let tls = TemporalTlsArgs {
            cert: Some("/x/cert.pem".into()),
            ..Default::default()
        };
        let err = tls.options().unwrap_err();
        assert!(err.contains("TEMPORAL_TLS_KEY"), "{err}");
        assert!(TemporalTlsArgs::default().options().unwrap().is_none());
        let on = TemporalTlsArgs {
            enabled: true,
            ..Default::default()
        };
        assert!(on.options().unwrap().is_some());
    }

    #[test]
    fn listen_address_error_names_the_flag() {
        assert!(parse_listen("--listen", "127.0.0.1:50051").is_ok());
        let err = parse_listen("--listen", "nope").unwrap_err();
        assert!(err.contains("--listen"), "{err}");
    }
}
