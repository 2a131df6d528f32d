//! The mesh under test. Dropping a `Mesh` stops every process it started.

use std::{
    path::Path,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};
use tonic::transport::Channel;
use tonic_health::pb::{
    HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
};

mod console;
mod programs;
mod tls;

pub(crate) use programs::free_port;
pub use programs::{agent_tools, bin_dir, temporal_cli};

pub const SERVICES: [&str; 5] = [
    "gateway",
    "sandbox-provisioner",
    "agent-runner",
    "budget-ledger",
    "janitor",
];

/// How the mesh is wired beyond the defaults.
#[derive(Debug, Clone, Default)]
pub struct MeshOptions {
    /// The gateway demands API keys (`FORKYARD_AUTH=api-key`); off: `none`, as the
    /// tests before tenancy expect.
    pub api_keys: bool,
    /// Mesh mTLS: `scripts/certs.sh` makes a CA and certificates in `<state>/certs`, every
    /// service serves TLS and internal ones require a client certificate.
    pub tls: bool,
    /// Extra environment for every service (e.g. the gateway's limits).
    pub env: Vec<(String, String)>,
    /// Extra environment for one service only: (service, name, value). A model API key
    /// goes to the agent runner alone, as in production.
    pub service_env: Vec<(String, String, String)>,
}

pub struct Mesh {
    pub state: tempfile::TempDir,
    pub temporal_port: u16,
    /// gRPC ports in the order of `SERVICES`.
    pub ports: [u16; 5],
    /// Prometheus `/metrics` ports in the order of `SERVICES`.
    pub metrics_ports: [u16; 5],
    /// The agent runner's LLM gateway port.
    pub llm_port: u16,
    pub(crate) children: Vec<(String, Child)>,
    pub(crate) options: MeshOptions,
}

impl Mesh {
    pub fn endpoint(&self, service: &str) -> String {
        format!("http://127.0.0.1:{}", self.port(service))
    }

    pub fn port(&self, service: &str) -> u16 {
        let i = SERVICES
            .iter()
            .position(|s| *s == service)
            .expect("known service");
        self.ports[i]
    }

    pub fn metrics_port(&self, service: &str) -> u16 {
        let i = SERVICES
            .iter()
            .position(|s| *s == service)
            .expect("known service");
        self.metrics_ports[i]
    }

    /// The service's Prometheus exposition, fetched over plain HTTP/1.1.
    pub fn scrape(&self, service: &str) -> anyhow::Result<String> {
        use std::io::{Read, Write};
        let mut conn = std::net::TcpStream::connect(("127.0.0.1", self.metrics_port(service)))?;
        conn.set_read_timeout(Some(Duration::from_secs(5)))?;
        conn.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")?;
        let mut body = String::new();
        conn.read_to_string(&mut body)?;
        anyhow::ensure!(
            body.starts_with("HTTP/1.1 200"),
            "scrape of {service}: {body}"
        );
        Ok(body)
    }

    pub fn state_dir(&self) -> &Path {
        self.state.path()
    }

    pub fn temporal_address(&self) -> String {
        format!("127.0.0.1:{}", self.temporal_port)
    }

    pub(crate) fn log_file(&self, name: &str) -> std::fs::File {
        let dir = self.state.path().join("logs");
        std::fs::create_dir_all(&dir).expect("log dir");
        // Appended to: a restarted service keeps its earlier log (what it made before a
        // kill is named there, and `support::sandbox_processes` reads the ids).
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join(format!("{name}.log")))
            .expect("log file")
    }

    /// Start the Temporal dev server and the five services; wait until all serve.
    pub async fn start() -> anyhow::Result<Self> {
        Self::start_with(MeshOptions::default()).await
    }

    /// `start` with `options`. A port taken between its pick and its bind (by another
    /// test's mesh) starts the mesh again on new ports, up to three times.
    pub async fn start_with(options: MeshOptions) -> anyhow::Result<Self> {
        let mut attempt = 1;
        loop {
            match Self::try_start(options.clone()).await {
                Err(e) if attempt < 3 && format!("{e:#}").contains("Address already in use") => {
                    eprintln!("mesh: a port was taken meanwhile, starting again: {e:#}");
                    attempt += 1;
                }
                other => return other,
            }
        }
    }

    async fn try_start(options: MeshOptions) -> anyhow::Result<Self> {
        let state = tempfile::Builder::new().prefix("forkyard-e2e-").tempdir()?;
        // Run as root, the provisioner runs each sandbox as a uid of its own, whose
        // bubblewrap must pass through here to the workspace (search only).
        std::fs::set_permissions(
            state.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o711),
        )?;
        let mut mesh = Mesh {
            state,
            temporal_port: free_port(),
            ports: [0; 5],
            metrics_ports: [0; 5],
            llm_port: free_port(),
            children: Vec::new(),
            options,
        };
        if mesh.options.tls {
            mesh.make_certs()?;
        }
        for p in mesh.ports.iter_mut().chain(mesh.metrics_ports.iter_mut()) {
            *p = free_port();
        }
        mesh.start_temporal("temporal.db")?;
        for service in SERVICES {
            mesh.start_service(service)?;
        }
        for service in SERVICES {
            mesh.wait_serving(service, Duration::from_secs(90)).await?;
        }
        Ok(mesh)
    }

    /// Start (or restart) the Temporal dev server on the mesh's port with its state in
    /// `db` (a new name starts from nothing: a disaster that lost Temporal's state).
    pub fn start_temporal(&mut self, db: &str) -> anyhow::Result<()> {
        let log = self.log_file("temporal");
        let ui_port = free_port();
        let child = Command::new(temporal_cli())
            .args([
                "server",
                "start-dev",
                "--headless",
                "--log-level",
                "warn",
                "--ip",
                "127.0.0.1",
            ])
            .args([
                "--port",
                &self.temporal_port.to_string(),
                "--ui-port",
                &ui_port.to_string(),
            ])
            .arg("--db-filename")
            .arg(self.state.path().join(db))
            // As `make up` does (scripts/up.sh): WAL with NORMAL sync survives a kill -9
            // of the server and costs a third of the CPU of SQLite's rollback journal.
            .args([
                "--sqlite-pragma",
                "journal_mode=wal",
                "--sqlite-pragma",
                "synchronous=normal",
            ])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| {
                anyhow::anyhow!(
                    "cannot start the temporal CLI ({}): {e}",
                    temporal_cli().display()
                )
            })?;
        self.children.retain(|(n, _)| n != "temporal");
        self.children.push(("temporal".into(), child));
        Ok(())
    }

    /// Set (or replace) one variable of the extra environment, for services started
    /// from now on (e.g. OTEL_EXPORTER_OTLP_ENDPOINT for a restarted service).
    pub fn set_env(&mut self, key: &str, value: &str) {
        self.options.env.retain(|(k, _)| k != key);
        self.options.env.push((key.to_owned(), value.to_owned()));
    }

    /// Set (`Some`) or remove (`None`) one variable of one service's own environment,
    /// for its next start (e.g. a fault point armed for one start only).
    pub fn set_service_env(&mut self, service: &str, key: &str, value: Option<&str>) {
        self.options
            .service_env
            .retain(|(s, k, _)| !(s == service && k == key));
        if let Some(v) = value {
            self.options
                .service_env
                .push((service.to_owned(), key.to_owned(), v.to_owned()));
        }
    }

    /// Wait up to `timeout` for `service` to exit on its own (a fault point, a crash):
    /// its exit status, or `None` while it still runs.
    pub fn wait_exit(
        &mut self,
        service: &str,
        timeout: Duration,
    ) -> Option<std::process::ExitStatus> {
        let (_, child) = self.children.iter_mut().find(|(n, _)| n == service)?;
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Start (or restart) one service binary with the mesh's wiring.
    pub fn start_service(&mut self, service: &str) -> anyhow::Result<()> {
        let bin = bin_dir().join(service);
        anyhow::ensure!(
            bin.exists(),
            "{} missing: build the services first (`cargo build --workspace --bins`; `make test` does)",
            bin.display()
        );
        let log = self.log_file(service);
        let mut cmd = Command::new(&bin);
        self.service_env(service, &mut cmd);
        let child = cmd
            .stdout(Stdio::null())
            .stderr(log)
            // Last, so a test's settings win over the defaults above.
            .envs(self.options.env.iter().map(|(k, v)| (k, v)))
            .envs(
                self.options
                    .service_env
                    .iter()
                    .filter(|(s, _, _)| s == service)
                    .map(|(_, k, v)| (k, v)),
            )
            .spawn()?;
        self.children.retain(|(n, _)| n != service);
        self.children.push((service.to_owned(), child));
        Ok(())
    }

    /// The environment every service of the mesh starts with: nothing of the test's own
    /// but PATH, the mesh's addresses and ports, and settings that keep tests exact.
    pub(crate) fn service_env(&self, service: &str, cmd: &mut Command) {
        cmd.env_clear();
        if self.options.tls {
            let certs = self.certs_dir();
            cmd.env("FORKYARD_TLS_CERT", certs.join(format!("{service}.pem")))
                .env("FORKYARD_TLS_KEY", certs.join(format!("{service}.key")))
                .env("FORKYARD_TLS_CA", certs.join("ca.pem"));
        }
        cmd.env(
            "FORKYARD_AUTH",
            if self.options.api_keys {
                "api-key"
            } else {
                "none"
            },
        );
        // Test repositories are made in the temp dir; with API keys on, local paths
        // need a listed root (the state dir is inside it, and is refused regardless).
        cmd.env("FORKYARD_LOCAL_REPO_ROOTS", std::env::temp_dir());
        // A killed gateway's runs wait this long for it before another takes them (10 s
        // by default): tests kill gateways often, and wait for nothing else there.
        cmd.env("FORKYARD_STICKY_TIMEOUT_SECS", "3");
        // Settings a benchmark run gives every service (`K=V`, blank-separated; e.g.
        // `FORKYARD_MESH_ENV='FORKYARD_WARM_COPIES_MIN=100' make bench-fanout`).
        for (k, v) in std::env::var("FORKYARD_MESH_ENV")
            .unwrap_or_default()
            .split_whitespace()
            .filter_map(|kv| kv.split_once('='))
        {
            cmd.env(k, v);
        }
        cmd.env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("RUST_LOG", "info")
            .env("TEMPORAL_ADDRESS", self.temporal_address())
            .env("TEMPORAL_NAMESPACE", "default")
            .env("FORKYARD_STATE_DIR", self.state.path())
            .env(
                "FORKYARD_LISTEN",
                format!("127.0.0.1:{}", self.port(service)),
            )
            .env(
                "FORKYARD_METRICS_LISTEN",
                format!("127.0.0.1:{}", self.metrics_port(service)),
            )
            .env(
                "FORKYARD_PROVISIONER_ADDR",
                self.endpoint("sandbox-provisioner"),
            )
            .env("FORKYARD_LEDGER_ADDR", self.endpoint("budget-ledger"))
            .env("FORKYARD_AGENT_RUNNER_ADDR", self.endpoint("agent-runner"))
            .env("FORKYARD_HEARTBEAT_SECS", "1")
            .env(
                "FORKYARD_LLM_LISTEN",
                format!("127.0.0.1:{}", self.llm_port),
            )
            // Sandbox time is free unless a test prices it: ledger figures stay exact.
            .env("FORKYARD_SANDBOX_CPU_SECOND_USD", "0")
            .env("FORKYARD_SANDBOX_GIB_SECOND_USD", "0")
            .envs(agent_tools().map(|d| ("FORKYARD_AGENT_TOOLS", d)))
            // No sweep on a schedule nobody asked for in the middle of a test (the
            // default schedule has its own test, which turns it on).
            .env("FORKYARD_CLEANUP_INTERVAL_MINUTES", "0");
    }

    /// Process ids of the running services (and `temporal`), by name.
    pub fn pids(&self) -> Vec<(String, u32)> {
        self.children
            .iter()
            .map(|(n, c)| (n.clone(), c.id()))
            .collect()
    }

    /// SIGKILL one process (a crash), leaving the others running.
    pub fn kill9(&mut self, service: &str) {
        if let Some((_, child)) = self.children.iter_mut().find(|(n, _)| n == service) {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERM one service and wait for it to exit; its exit status, or `None` if it did
    /// not stop within `timeout` (then it is killed).
    pub fn terminate(
        &mut self,
        service: &str,
        timeout: Duration,
    ) -> Option<std::process::ExitStatus> {
        let (_, child) = self.children.iter_mut().find(|(n, _)| n == service)?;
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(child.id().to_string())
            .status();
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        let _ = child.wait();
        None
    }

    pub async fn channel(&self, service: &str) -> anyhow::Result<Channel> {
        if self.options.tls {
            return self.tls_channel(service, Some("client")).await;
        }
        Ok(
            tonic::transport::Endpoint::from_shared(self.endpoint(service))?
                .connect_timeout(Duration::from_secs(2))
                .connect()
                .await?,
        )
    }

    pub async fn wait_serving(&mut self, service: &str, timeout: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            // The service, and Temporal: a dev server that could not bind its port has
            // exited, and whatever holds that port is no Temporal to wait for.
            for name in [service, "temporal"] {
                if let Some((_, child)) = self.children.iter_mut().find(|(n, _)| n == name)
                    && let Ok(Some(status)) = child.try_wait()
                {
                    anyhow::bail!("{name} exited with {status}; log:\n{}", self.log_tail(name));
                }
            }
            if let Ok(ch) = self.channel(service).await {
                let mut health = HealthClient::new(ch);
                let check = health.check(HealthCheckRequest {
                    service: String::new(),
                });
                // A service that took the connection and never answers is not serving:
                // asked again, until the deadline, rather than waited on for ever.
                let res = tokio::time::timeout(Duration::from_secs(5), check).await;
                if res.is_ok_and(|r| {
                    r.is_ok_and(|r| r.into_inner().status == ServingStatus::Serving as i32)
                }) {
                    return Ok(());
                }
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "{service} not SERVING in time; log:\n{}",
                self.log_tail(service)
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    pub fn log_tail(&self, name: &str) -> String {
        let text =
            std::fs::read_to_string(self.state.path().join("logs").join(format!("{name}.log")))
                .unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }
}

impl Drop for Mesh {
    fn drop(&mut self) {
        // A failed test's only trace of what the services did: their logs go with the
        // temp dir, so print each one's tail (CI keeps the test's stderr).
        if std::thread::panicking() {
            let names: Vec<String> = self.children.iter().map(|(n, _)| n.clone()).collect();
            for name in names {
                eprintln!("----- {name}.log (tail) -----\n{}", self.log_tail(&name));
            }
        }
        // Services first (SIGTERM, so they drain), Temporal last.
        for (_, child) in self.children.iter_mut().rev() {
            let _ = Command::new("kill")
                .arg("-TERM")
                .arg(child.id().to_string())
                .status();
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        for (_, child) in &mut self.children {
            while Instant::now() < deadline {
                if matches!(child.try_wait(), Ok(Some(_))) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        // A provisioner killed before its drain ended (or on purpose) leaves its groups,
        // and no later start reconciles a temp dir: each one left makes every CPU-limit
        // write on the host dearer (the kernel walks all task groups).
        let state = self.state.path();
        let dirs = std::fs::read_dir(state)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .chain([state.to_path_buf()]);
        for dir in dirs.filter(|d| d.join("sandboxes").is_dir()) {
            forkyard_sandbox_provisioner::local::isolation::cgroup::remove_instance(
                "forkyard", &dir,
            );
        }
    }
}
